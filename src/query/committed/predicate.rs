//! Queries, the committed side: the pushed-down DataFusion filters turned into one Iceberg
//! predicate, which Iceberg's planning projects onto each partition spec (identity, year,
//! month, day, hour, bucket, truncate) and checks against the manifests' partition values
//! and column metrics to skip data files.
//!
//! The predicate only ever keeps more rows than the filters: every row a filter keeps
//! satisfies it (a part that does not convert is left out of an `AND`, and makes an `OR` or
//! a `NOT` not convert). Literals are converted to the column's own type, and a cast of the
//! column (DataFusion's coercion, `CAST(created_at AS DATE)`) is undone exactly or the filter
//! is not used: dropping a cast blindly (`CAST(i AS TEXT) < '5'` as `i < 5`, or a
//! nanosecond literal read as microseconds) would skip files holding matching rows.

use arrow::datatypes::{DataType, Schema, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::expr::{InList, Like};
use datafusion::logical_expr::{Between, BinaryExpr, Cast, Expr, Operator, TryCast};
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::Datum;

/// The filters (over `schema`, the committed table's columns, named as in Iceberg) as one
/// Iceberg predicate every row they keep satisfies; `None` when none of them converts.
pub fn iceberg_predicate(filters: &[Expr], schema: &Schema) -> Option<Predicate> {
    filters
        .iter()
        .filter_map(|f| convert(f, schema).map(|c| c.predicate))
        .reduce(Predicate::and)
}

/// A converted filter, and whether it keeps exactly the rows the filter keeps (only an
/// exact predicate may be negated).
struct Converted {
    predicate: Predicate,
    exact: bool,
}

fn exact(predicate: Predicate) -> Option<Converted> {
    Some(Converted {
        predicate,
        exact: true,
    })
}

fn convert(expr: &Expr, schema: &Schema) -> Option<Converted> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => match (convert(left, schema), convert(right, schema)) {
                (Some(l), Some(r)) => Some(Converted {
                    predicate: l.predicate.and(r.predicate),
                    exact: l.exact && r.exact,
                }),
                (Some(one), None) | (None, Some(one)) => Some(Converted {
                    predicate: one.predicate,
                    exact: false,
                }),
                (None, None) => None,
            },
            Operator::Or => {
                let (l, r) = (convert(left, schema)?, convert(right, schema)?);
                Some(Converted {
                    predicate: l.predicate.or(r.predicate),
                    exact: l.exact && r.exact,
                })
            }
            _ => {
                let op = Cmp::of(*op)?;
                if let (Some(side), Some(v)) = (Side::of(left, schema), literal(right)) {
                    side.compare(op, v)
                } else if let (Some(v), Some(side)) = (literal(left), Side::of(right, schema)) {
                    side.compare(op.flipped(), v)
                } else {
                    None
                }
            }
        },
        Expr::Not(inner) => match inner.as_ref() {
            Expr::Column(_) => Side::of(inner, schema)?.boolean(false),
            _ => {
                let c = convert(inner, schema)?;
                c.exact.then(|| Converted {
                    predicate: !c.predicate,
                    exact: true,
                })
            }
        },
        Expr::Column(_) => Side::of(expr, schema)?.boolean(true),
        Expr::IsTrue(inner) => Side::of(inner, schema)?.boolean(true),
        Expr::IsFalse(inner) => Side::of(inner, schema)?.boolean(false),
        Expr::IsNull(inner) => exact(Side::of(inner, schema)?.reference().is_null()),
        Expr::IsNotNull(inner) => exact(Side::of(inner, schema)?.reference().is_not_null()),
        Expr::InList(InList {
            expr,
            list,
            negated,
        }) => {
            let side = Side::of(expr, schema)?;
            let mut values = Vec::with_capacity(list.len());
            for item in list {
                match literal_or_null(item)? {
                    Some(v) => values.push(v),
                    // `x IN (1, NULL)` keeps the rows `x IN (1)` keeps; `x NOT IN (1, NULL)`
                    // keeps none, which is not worth a predicate.
                    None if *negated => return None,
                    None => {}
                }
            }
            negated_if(side.one_of(values)?, *negated)
        }
        Expr::Between(Between {
            expr,
            negated,
            low,
            high,
        }) => {
            let side = Side::of(expr, schema)?;
            let lo = side.compare(Cmp::GtEq, literal(low)?)?;
            let hi = side.compare(Cmp::LtEq, literal(high)?)?;
            let c = Converted {
                predicate: lo.predicate.and(hi.predicate),
                exact: lo.exact && hi.exact,
            };
            negated_if(c, *negated)
        }
        Expr::Like(like) => convert_like(like, schema),
        Expr::ScalarFunction(f) if f.func.name() == "starts_with" => match f.args.as_slice() {
            [column, prefix] => {
                let side = Side::of(column, schema)?;
                match literal(prefix)? {
                    ScalarValue::Utf8(Some(p))
                    | ScalarValue::LargeUtf8(Some(p))
                    | ScalarValue::Utf8View(Some(p)) => side.prefix(&p, false),
                    _ => None,
                }
            }
            _ => None,
        },
        _ => None,
    }
}

/// `c LIKE 'abc%'` is a prefix, `c LIKE 'abc'` an equality; other patterns do not convert.
fn convert_like(like: &Like, schema: &Schema) -> Option<Converted> {
    if like.case_insensitive || like.escape_char.is_some() {
        return None;
    }
    let side = Side::of(&like.expr, schema)?;
    let pattern = match literal(&like.pattern)? {
        ScalarValue::Utf8(Some(p))
        | ScalarValue::LargeUtf8(Some(p))
        | ScalarValue::Utf8View(Some(p)) => p,
        _ => return None,
    };
    let wild = |s: &str| s.contains(['%', '_', '\\']);
    if !wild(&pattern) {
        let op = if like.negated { Cmp::NotEq } else { Cmp::Eq };
        return side.compare(op, ScalarValue::Utf8(Some(pattern)));
    }
    let prefix = pattern.strip_suffix('%')?;
    if prefix.is_empty() || wild(prefix) {
        return None;
    }
    side.prefix(prefix, like.negated)
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cmp {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

impl Cmp {
    fn of(op: Operator) -> Option<Self> {
        Some(match op {
            Operator::Eq => Self::Eq,
            Operator::NotEq => Self::NotEq,
            Operator::Lt => Self::Lt,
            Operator::LtEq => Self::LtEq,
            Operator::Gt => Self::Gt,
            Operator::GtEq => Self::GtEq,
            _ => return None,
        })
    }

    /// The operator with its sides swapped (`5 < c` is `c > 5`).
    fn flipped(self) -> Self {
        match self {
            Self::Lt => Self::Gt,
            Self::LtEq => Self::GtEq,
            Self::Gt => Self::Lt,
            Self::GtEq => Self::LtEq,
            same => same,
        }
    }

    fn apply(self, r: Reference, d: Datum) -> Predicate {
        match self {
            Self::Eq => r.equal_to(d),
            Self::NotEq => r.not_equal_to(d),
            Self::Lt => r.less_than(d),
            Self::LtEq => r.less_than_or_equal_to(d),
            Self::Gt => r.greater_than(d),
            Self::GtEq => r.greater_than_or_equal_to(d),
        }
    }
}

/// How the value a filter compares relates to the column's own: the same value (possibly a
/// wider type), the column's times `k` (a date or a coarser timestamp cast to a finer
/// unit, an integer or decimal cast to more decimal places), or the floor of the column's
/// value over `k` (a timestamp cast to a date).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Undo {
    Same,
    Times(i128),
    FloorDiv(i128),
}

/// The column side of a comparison: a column, or a cast of one that can be undone.
struct Side {
    name: String,
    /// The column's type.
    column: DataType,
    /// The type the filter compares in (the cast's, or the column's).
    outer: DataType,
    map: Undo,
}

impl Side {
    fn of(expr: &Expr, schema: &Schema) -> Option<Self> {
        let (column, outer) = match expr {
            Expr::Column(c) => (c, None),
            Expr::Cast(Cast {
                expr, data_type, ..
            })
            | Expr::TryCast(TryCast {
                expr, data_type, ..
            }) => match expr.as_ref() {
                Expr::Column(c) => (c, Some(data_type.clone())),
                _ => return None,
            },
            _ => return None,
        };
        let field = schema.field_with_name(&column.name).ok()?;
        let ty = field.data_type().clone();
        let (outer, map) = match outer {
            None => (ty.clone(), Undo::Same),
            Some(to) => {
                let map = cast_map(&ty, &to)?;
                (to, map)
            }
        };
        Some(Self {
            name: column.name.clone(),
            column: ty,
            outer,
            map,
        })
    }

    fn reference(&self) -> Reference {
        Reference::new(self.name.clone())
    }

    /// A boolean column (or `NOT` of one) as a filter.
    fn boolean(&self, value: bool) -> Option<Converted> {
        (self.column == DataType::Boolean && self.map == Undo::Same)
            .then(|| exact(self.reference().equal_to(Datum::bool(value))))
            .flatten()
    }

    /// `column <op> v`, `v` a value of the type the filter compares in.
    fn compare(&self, op: Cmp, v: ScalarValue) -> Option<Converted> {
        if v.is_null() {
            return None;
        }
        match self.map {
            Undo::Same => {
                let d = self.datum(&v)?;
                exact(op.apply(self.reference(), d))
            }
            Undo::Times(k) => {
                let l = ticks(&self.outer_value(v)?)?;
                // column * k <op> l
                let (op, c) = match op {
                    Cmp::Eq | Cmp::NotEq => {
                        if l.rem_euclid(k) != 0 {
                            // No column value equals it.
                            let p = match op {
                                Cmp::Eq => Predicate::AlwaysFalse,
                                _ => self.reference().is_not_null(),
                            };
                            return exact(p);
                        }
                        (op, l.div_euclid(k))
                    }
                    Cmp::Gt => (Cmp::Gt, l.div_euclid(k)),
                    Cmp::LtEq => (Cmp::LtEq, l.div_euclid(k)),
                    Cmp::GtEq => (Cmp::GtEq, ceil_div(l, k)),
                    Cmp::Lt => (Cmp::Lt, ceil_div(l, k)),
                };
                exact(op.apply(self.reference(), self.tick_datum(c)?))
            }
            Undo::FloorDiv(k) => {
                let l = ticks(&self.outer_value(v)?)?;
                // floor(column / k) <op> l: column against [l*k, (l+1)*k - 1].
                let first = l.checked_mul(k)?;
                let last = l.checked_add(1)?.checked_mul(k)?.checked_sub(1)?;
                let r = || self.reference();
                let p = match op {
                    Cmp::Eq => r()
                        .greater_than_or_equal_to(self.tick_datum(first)?)
                        .and(r().less_than_or_equal_to(self.tick_datum(last)?)),
                    Cmp::NotEq => r()
                        .less_than(self.tick_datum(first)?)
                        .or(r().greater_than(self.tick_datum(last)?)),
                    Cmp::Gt => r().greater_than(self.tick_datum(last)?),
                    Cmp::GtEq => r().greater_than_or_equal_to(self.tick_datum(first)?),
                    Cmp::Lt => r().less_than(self.tick_datum(first)?),
                    Cmp::LtEq => r().less_than_or_equal_to(self.tick_datum(last)?),
                };
                exact(p)
            }
        }
    }

    /// `column IN (values)`.
    fn one_of(&self, values: Vec<ScalarValue>) -> Option<Converted> {
        if values.is_empty() {
            return None;
        }
        if self.map == Undo::Same {
            let datums: Option<Vec<Datum>> = values.iter().map(|v| self.datum(v)).collect();
            return exact(self.reference().is_in(datums?));
        }
        values
            .into_iter()
            .map(|v| self.compare(Cmp::Eq, v))
            .try_fold(None::<Converted>, |acc, c| {
                let c = c?;
                Some(Some(match acc {
                    None => c,
                    Some(a) => Converted {
                        predicate: a.predicate.or(c.predicate),
                        exact: a.exact && c.exact,
                    },
                }))
            })
            .flatten()
    }

    /// `column LIKE 'prefix%'` (or `NOT LIKE`) on a string column.
    fn prefix(&self, prefix: &str, negated: bool) -> Option<Converted> {
        if self.map != Undo::Same || !is_string(&self.column) {
            return None;
        }
        let r = self.reference();
        if prefix.is_ascii() {
            let d = Datum::string(prefix);
            return exact(if negated {
                r.not_starts_with(d)
            } else {
                r.starts_with(d)
            });
        }
        // Iceberg's projection of a prefix onto truncate[W] compares the prefix's length in
        // bytes with W (in characters): a multi-byte prefix could skip matching files.
        // The prefix's lower bound is safe.
        if negated {
            return None;
        }
        Some(Converted {
            predicate: r.greater_than_or_equal_to(Datum::string(prefix)),
            exact: false,
        })
    }

    /// `v` (of the type the filter compares in) as the column's Iceberg value, when that
    /// type holds it exactly.
    fn datum(&self, v: &ScalarValue) -> Option<Datum> {
        let v = self.outer_value(v.clone())?;
        let v = if same_type(&v.data_type(), &self.column) {
            v
        } else {
            let cast = v.cast_to(&self.column).ok()?;
            // Only a cast that loses nothing (a wider integer that fits, a string kind).
            if cast.cast_to(&v.data_type()).ok()? != v {
                return None;
            }
            cast
        };
        datum_of(&v, &self.column)
    }

    /// `v` in the type the filter compares in (DataFusion's coercion already did this; a
    /// literal of another type is cast only when nothing is lost).
    fn outer_value(&self, v: ScalarValue) -> Option<ScalarValue> {
        if same_type(&v.data_type(), &self.outer) {
            return Some(v);
        }
        let cast = v.cast_to(&self.outer).ok()?;
        (cast.cast_to(&v.data_type()).ok()? == v).then_some(cast)
    }

    /// An integer count of the column's unit (days, microseconds, a decimal's mantissa) as
    /// the column's Iceberg value.
    fn tick_datum(&self, t: i128) -> Option<Datum> {
        let v = match &self.column {
            DataType::Int8 | DataType::Int16 | DataType::Int32 => {
                ScalarValue::Int32(Some(i32::try_from(t).ok()?))
            }
            DataType::Int64 => ScalarValue::Int64(Some(i64::try_from(t).ok()?)),
            DataType::Date32 => ScalarValue::Date32(Some(i32::try_from(t).ok()?)),
            DataType::Timestamp(TimeUnit::Microsecond, tz) => {
                ScalarValue::TimestampMicrosecond(Some(i64::try_from(t).ok()?), tz.clone())
            }
            DataType::Timestamp(TimeUnit::Nanosecond, tz) => {
                ScalarValue::TimestampNanosecond(Some(i64::try_from(t).ok()?), tz.clone())
            }
            DataType::Decimal128(p, s) => ScalarValue::Decimal128(Some(t), *p, *s),
            _ => return None,
        };
        datum_of(&v, &self.column)
    }
}

/// How a cast from `from` (the column's type) to `to` maps values, when it can be undone:
/// widening integers, a string kind to another, a finer timestamp unit, a date to a
/// timestamp, a timestamp to a date, more decimal places. Time zones must stay UTC (a
/// naive timestamp cast to a zone, or a date in a zone, moves by the zone's offset).
fn cast_map(from: &DataType, to: &DataType) -> Option<Undo> {
    use DataType::*;
    let int_width = |t: &DataType| match t {
        Int8 => Some(8),
        Int16 => Some(16),
        Int32 => Some(32),
        Int64 => Some(64),
        _ => None,
    };
    if from == to {
        return Some(Undo::Same);
    }
    match (from, to) {
        (a, b) if int_width(a).is_some() && int_width(b).is_some() => {
            (int_width(a)? <= int_width(b)?).then_some(Undo::Same)
        }
        (a, b) if is_string(a) && is_string(b) => Some(Undo::Same),
        (Timestamp(fu, ftz), Timestamp(tu, ttz)) => {
            let tz_ok = match (ftz, ttz) {
                (None, Some(tz)) => utc(tz),
                _ => true,
            };
            let (f, t) = (unit_per_second(*fu), unit_per_second(*tu));
            (tz_ok && t >= f).then_some(if t == f {
                Undo::Same
            } else {
                Undo::Times(t / f)
            })
        }
        (Date32, Timestamp(u, tz)) => tz
            .as_deref()
            .is_none_or(utc)
            .then(|| Undo::Times(86_400 * unit_per_second(*u))),
        (Timestamp(u, tz), Date32) => tz
            .as_deref()
            .is_none_or(utc)
            .then(|| Undo::FloorDiv(86_400 * unit_per_second(*u))),
        (a, Decimal128(_, s)) if int_width(a).is_some() => {
            Some(Undo::Times(10i128.checked_pow(u32::try_from(*s).ok()?)?))
        }
        (Decimal128(_, fs), Decimal128(_, ts)) if ts >= fs => {
            let up = u32::try_from(*ts - *fs).ok()?;
            Some(if up == 0 {
                Undo::Same
            } else {
                Undo::Times(10i128.checked_pow(up)?)
            })
        }
        _ => None,
    }
}

fn unit_per_second(u: TimeUnit) -> i128 {
    match u {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    }
}

fn utc(tz: &str) -> bool {
    matches!(
        tz,
        "+00:00" | "+00" | "+0000" | "-00:00" | "UTC" | "Z" | "Etc/UTC" | "utc"
    )
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// Types equal but for a timestamp's zone (Arrow keeps instants in UTC whatever the zone).
fn same_type(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::Timestamp(ua, _), DataType::Timestamp(ub, _)) => ua == ub,
        _ => a == b,
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a.div_euclid(b);
    if a.rem_euclid(b) == 0 {
        q
    } else {
        q + 1
    }
}

/// A value as an integer count of its unit (days, the timestamp's unit, a decimal's
/// mantissa, the integer itself).
fn ticks(v: &ScalarValue) -> Option<i128> {
    Some(match v {
        ScalarValue::Int8(Some(x)) => i128::from(*x),
        ScalarValue::Int16(Some(x)) => i128::from(*x),
        ScalarValue::Int32(Some(x)) => i128::from(*x),
        ScalarValue::Int64(Some(x)) => i128::from(*x),
        ScalarValue::Date32(Some(x)) => i128::from(*x),
        ScalarValue::TimestampSecond(Some(x), _)
        | ScalarValue::TimestampMillisecond(Some(x), _)
        | ScalarValue::TimestampMicrosecond(Some(x), _)
        | ScalarValue::TimestampNanosecond(Some(x), _) => i128::from(*x),
        ScalarValue::Decimal128(Some(x), _, _) => *x,
        _ => return None,
    })
}

/// A literal operand (a constant the optimizer folded, possibly under a cast it left).
fn literal(expr: &Expr) -> Option<ScalarValue> {
    literal_or_null(expr)?
}

/// `Some(None)` for a NULL literal.
fn literal_or_null(expr: &Expr) -> Option<Option<ScalarValue>> {
    match expr {
        Expr::Literal(v, _) => Some((!v.is_null()).then(|| v.clone())),
        Expr::Cast(Cast {
            expr, data_type, ..
        }) => match expr.as_ref() {
            Expr::Literal(v, _) if v.is_null() => Some(None),
            Expr::Literal(v, _) => Some(Some(v.cast_to(data_type).ok()?)),
            _ => None,
        },
        _ => None,
    }
}

/// A value of the column's type `ty` as the Iceberg value of that column.
fn datum_of(v: &ScalarValue, ty: &DataType) -> Option<Datum> {
    Some(match (v, ty) {
        (ScalarValue::Boolean(Some(b)), DataType::Boolean) => Datum::bool(*b),
        (ScalarValue::Int8(Some(x)), DataType::Int8) => Datum::int(i32::from(*x)),
        (ScalarValue::Int16(Some(x)), DataType::Int16) => Datum::int(i32::from(*x)),
        (ScalarValue::Int32(Some(x)), DataType::Int8 | DataType::Int16 | DataType::Int32) => {
            Datum::int(*x)
        }
        (ScalarValue::Int64(Some(x)), DataType::Int64) => Datum::long(*x),
        (ScalarValue::Float32(Some(x)), DataType::Float32) if !x.is_nan() => Datum::float(*x),
        (ScalarValue::Float64(Some(x)), DataType::Float64) if !x.is_nan() => Datum::double(*x),
        (
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
            t,
        ) if is_string(t) => Datum::string(s),
        (
            ScalarValue::Binary(Some(b))
            | ScalarValue::LargeBinary(Some(b))
            | ScalarValue::BinaryView(Some(b)),
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView,
        ) => Datum::binary(b.iter().copied()),
        (ScalarValue::FixedSizeBinary(16, Some(b)), DataType::FixedSizeBinary(16)) => {
            Datum::uuid(uuid::Uuid::from_slice(b).ok()?)
        }
        (ScalarValue::Date32(Some(d)), DataType::Date32) => Datum::date(*d),
        (ScalarValue::Time64Microsecond(Some(t)), DataType::Time64(TimeUnit::Microsecond)) => {
            Datum::time_micros(*t).ok()?
        }
        (
            ScalarValue::TimestampMicrosecond(Some(t), _),
            DataType::Timestamp(TimeUnit::Microsecond, tz),
        ) => match tz {
            None => Datum::timestamp_micros(*t),
            Some(_) => Datum::timestamptz_micros(*t),
        },
        (
            ScalarValue::TimestampNanosecond(Some(t), _),
            DataType::Timestamp(TimeUnit::Nanosecond, tz),
        ) => match tz {
            None => Datum::timestamp_nanos(*t),
            Some(_) => Datum::timestamptz_nanos(*t),
        },
        (ScalarValue::Decimal128(Some(m), _, vs), DataType::Decimal128(_, s)) if vs == s => {
            Datum::decimal_from_str(decimal_text(*m, *s)?).ok()?
        }
        _ => return None,
    })
}

/// A decimal's mantissa and scale as text (`12345`, 2 is `123.45`), which keeps the scale.
fn decimal_text(mantissa: i128, scale: i8) -> Option<String> {
    let scale = usize::try_from(scale).ok()?;
    let digits = mantissa.unsigned_abs().to_string();
    let sign = if mantissa < 0 { "-" } else { "" };
    if scale == 0 {
        return Some(format!("{sign}{digits}"));
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    Some(format!("{sign}{int}.{frac}"))
}

/// `c`, or its negation when `negated`: only an exact conversion can be negated (the negation
/// of a looser predicate would skip files holding matching rows).
fn negated_if(c: Converted, negated: bool) -> Option<Converted> {
    if negated {
        c.exact.then(|| Converted {
            predicate: !c.predicate,
            exact: true,
        })
    } else {
        Some(c)
    }
}

#[cfg(test)]
#[path = "predicate_tests.rs"]
mod tests;
