//! Postgres's `avg()` for the query engine (`skipprd query` and the gateway plan with it): the
//! mean of integers and numerics is a numeric, rounded where Postgres rounds a division (at
//! least 16 significant digits); the mean of floats and durations stays the engine's own.

use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Decimal128Builder, ListArray, UInt64Array,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{i256, DataType, Decimal128Type, Field, FieldRef, UInt64Type};
use datafusion::common::{plan_err, DataFusionError, Result, ScalarValue};
use datafusion::functions_aggregate::average::Avg;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, ReversedUDAF,
    Signature, Volatility,
};

/// Field metadata on an `avg()` result: the smallest scale Postgres shows for it (its input's
/// scale). The wire and `skipprd query` show each value with the digits Postgres shows (see
/// [`display_scale`]); the column itself holds a fixed scale.
pub const QUOTIENT_SCALE_META: &str = "skippr.pg_quotient_scale";

/// Postgres's significant digits in a division's result (`NUMERIC_MIN_SIG_DIGITS`).
const MIN_SIG_DIGITS: i32 = 16;
/// Decimal digits in one of Postgres's numeric digits (base 10000).
const DEC_DIGITS: i32 = 4;
/// The widest Arrow decimal.
const MAX_PRECISION: u8 = 38;
/// Most fraction digits an average holds: Postgres's for a mean below one (weight -1).
const MAX_RESULT_SCALE: i32 = 20;

/// `avg`, replacing the engine's built-in one under the same name (and its alias `mean`).
pub fn avg() -> AggregateUDF {
    AggregateUDF::from(PgAvg::default())
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct PgAvg {
    signature: Signature,
    engine: Avg,
    aliases: Vec<String>,
}

impl Default for PgAvg {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
            engine: Avg::new(),
            aliases: vec!["mean".to_string()],
        }
    }
}

/// How a numeric mean is held: the input's scale, and the result's precision and scale.
#[derive(Debug, Clone, Copy)]
struct Shape {
    input_scale: i8,
    precision: u8,
    scale: i8,
}

impl Shape {
    /// The shape for an argument of type `dt` (after coercion), if it is a numeric.
    fn of(dt: &DataType) -> Option<Self> {
        let DataType::Decimal128(p, s) = dt else {
            return None;
        };
        let s = (*s).max(0);
        let int_digits = (*p as i32 - s as i32).max(1);
        let scale = MAX_RESULT_SCALE
            .max(s as i32)
            .min(MAX_PRECISION as i32 - int_digits)
            .max(s as i32);
        Some(Self {
            input_scale: s,
            precision: (int_digits + scale).min(MAX_PRECISION as i32) as u8,
            scale: scale as i8,
        })
    }

    fn result_type(&self) -> DataType {
        DataType::Decimal128(self.precision, self.scale)
    }

    fn sum_type(&self) -> DataType {
        DataType::Decimal128(MAX_PRECISION, self.input_scale)
    }
}

impl AggregateUDFImpl for PgAvg {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "avg"
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Integers are read as numerics of their width (Postgres's `avg(int)` is a numeric),
    /// floats as double precision; numerics and durations as they are.
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let [dt] = arg_types else {
            return plan_err!("avg() takes one argument, not {}", arg_types.len());
        };
        let to = match dt {
            DataType::Int8 | DataType::UInt8 => DataType::Decimal128(3, 0),
            DataType::Int16 | DataType::UInt16 => DataType::Decimal128(5, 0),
            DataType::Int32 | DataType::UInt32 => DataType::Decimal128(10, 0),
            DataType::Int64 => DataType::Decimal128(19, 0),
            DataType::UInt64 => DataType::Decimal128(20, 0),
            DataType::Decimal32(p, s) | DataType::Decimal64(p, s) => DataType::Decimal128(*p, *s),
            DataType::Decimal128(..) | DataType::Decimal256(..) | DataType::Duration(_) => {
                dt.clone()
            }
            DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Null => {
                DataType::Float64
            }
            other => return plan_err!("function avg({other}) does not exist"),
        };
        Ok(vec![to])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first().and_then(Shape::of) {
            Some(shape) => Ok(shape.result_type()),
            None => self.engine.return_type(arg_types),
        }
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> Result<FieldRef> {
        let types: Vec<DataType> = arg_fields.iter().map(|f| f.data_type().clone()).collect();
        let field = Field::new(self.name(), self.return_type(&types)?, true);
        Ok(Arc::new(match types.first().and_then(Shape::of) {
            Some(shape) => field.with_metadata(
                [(
                    QUOTIENT_SCALE_META.to_string(),
                    shape.input_scale.to_string(),
                )]
                .into(),
            ),
            None => field,
        }))
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let Some(shape) = Shape::of(args.expr_fields[0].data_type()) else {
            return self.engine.accumulator(args);
        };
        Ok(if args.is_distinct {
            Box::new(DistinctMean {
                shape,
                seen: HashSet::new(),
            })
        } else {
            Box::new(Mean {
                shape,
                sum: 0,
                count: 0,
            })
        })
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let Some(shape) = Shape::of(args.input_fields[0].data_type()) else {
            return self.engine.state_fields(args);
        };
        Ok(if args.is_distinct {
            vec![Arc::new(Field::new_list(
                format_state_name(args.name, "avg distinct"),
                Field::new_list_field(shape.sum_type(), true),
                false,
            ))]
        } else {
            vec![
                Arc::new(Field::new(
                    format_state_name(args.name, "count"),
                    DataType::UInt64,
                    true,
                )),
                Arc::new(Field::new(
                    format_state_name(args.name, "sum"),
                    shape.sum_type(),
                    true,
                )),
            ]
        })
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        match Shape::of(args.expr_fields[0].data_type()) {
            Some(_) => !args.is_distinct,
            None => self.engine.groups_accumulator_supported(args),
        }
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        match Shape::of(args.expr_fields[0].data_type()) {
            Some(shape) => Ok(Box::new(GroupMeans {
                shape,
                sums: Vec::new(),
                counts: Vec::new(),
            })),
            None => self.engine.create_groups_accumulator(args),
        }
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::Identical
    }
}

fn overflow() -> DataFusionError {
    DataFusionError::Execution(
        "numeric field overflow in avg(): the sum passes 38 digits; cast the argument to double precision".into(),
    )
}

fn add(a: i128, b: i128) -> Result<i128> {
    a.checked_add(b).ok_or_else(overflow)
}

fn pow10(n: i32) -> i256 {
    i256::from_i128(10).wrapping_pow(n.max(0) as u32)
}

/// The weight (in base-10000 digits, 0 for the units) and the value of the first nonzero
/// base-10000 digit of `|v| / 10^scale`, as Postgres's numeric holds it; (0, 0) for zero.
fn first_digit(v: i256, scale: i32) -> (i32, i256) {
    let v = v.wrapping_abs();
    if v == i256::ZERO {
        return (0, i256::ZERO);
    }
    // Pad the fraction to whole base-10000 digits, then count digits from the point.
    let frac_digits = (scale + DEC_DIGITS - 1).div_euclid(DEC_DIGITS) * DEC_DIGITS;
    let padded = v.wrapping_mul(pow10(frac_digits - scale));
    let base = i256::from_i128(10_000);
    let mut groups = 0;
    let mut rest = padded;
    let mut top = padded;
    while rest != i256::ZERO {
        top = rest;
        rest = rest.wrapping_div(base);
        groups += 1;
    }
    (groups - 1 - frac_digits / DEC_DIGITS, top)
}

/// Postgres's result scale for `sum / count` (`select_div_scale`): enough fraction digits for
/// 16 significant ones, never fewer than the dividend's.
fn division_scale(sum: i128, input_scale: i8, count: u64) -> i32 {
    let (w1, d1) = first_digit(i256::from_i128(sum), input_scale as i32);
    let (w2, d2) = first_digit(i256::from_i128(count as i128), 0);
    let mut qweight = w1 - w2;
    if d1 <= d2 {
        qweight -= 1;
    }
    (MIN_SIG_DIGITS - qweight * DEC_DIGITS)
        .max(input_scale as i32)
        .clamp(0, 1000)
}

/// `sum / count` as Postgres computes it (rounded half away from zero at its result scale,
/// or at the column's scale where that is smaller), held at `shape.scale`.
fn mean(sum: i128, count: u64, shape: Shape) -> Result<Option<i128>> {
    if count == 0 {
        return Ok(None);
    }
    let scale = division_scale(sum, shape.input_scale, count).min(shape.scale as i32);
    let numerator = i256::from_i128(sum)
        .checked_mul(pow10(scale - shape.input_scale as i32))
        .ok_or_else(overflow)?;
    let n = i256::from_i128(count as i128);
    let mut q = numerator.wrapping_div(n);
    let twice_rem = numerator
        .wrapping_rem(n)
        .wrapping_abs()
        .wrapping_mul(i256::from_i128(2));
    if twice_rem >= n {
        q = if numerator < i256::ZERO {
            q.wrapping_sub(i256::ONE)
        } else {
            q.wrapping_add(i256::ONE)
        };
    }
    let held = q
        .checked_mul(pow10(shape.scale as i32 - scale))
        .and_then(|v| v.to_i128())
        .ok_or_else(overflow)?;
    Ok(Some(held))
}

/// The fraction digits Postgres shows for a mean `v` held at `scale` whose input had
/// `input_scale`: 16 significant digits (from the value's own magnitude), never fewer than
/// the input's, and every nonzero digit held.
pub fn display_scale(v: i128, scale: i8, input_scale: i8) -> i8 {
    let scale = scale.max(0);
    if v == 0 {
        return (MAX_RESULT_SCALE as i8).min(scale);
    }
    let (weight, _) = first_digit(i256::from_i128(v), scale as i32);
    let wanted = (MIN_SIG_DIGITS - weight * DEC_DIGITS).max(input_scale as i32);
    let mut zeros = 0;
    let mut rest = v.unsigned_abs();
    while zeros < scale && rest.is_multiple_of(10) {
        rest /= 10;
        zeros += 1;
    }
    wanted.max((scale - zeros) as i32).min(scale as i32) as i8
}

/// `v` held at `scale`, shown with `shown` fraction digits (the ones dropped are zeros).
pub fn decimal_text(v: i128, scale: i8, shown: i8) -> String {
    let drop = (scale - shown).max(0) as u32;
    let v = v / 10_i128.pow(drop);
    let shown = shown.max(0) as usize;
    let digits = format!("{:0>width$}", v.unsigned_abs(), width = shown + 1);
    let (int, frac) = digits.split_at(digits.len() - shown);
    let sign = if v < 0 { "-" } else { "" };
    if frac.is_empty() {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}

fn decimals(values: impl IntoIterator<Item = Option<i128>>, dt: &DataType) -> Result<ArrayRef> {
    let mut b = Decimal128Builder::new();
    for v in values {
        b.append_option(v);
    }
    Ok(Arc::new(b.finish().with_data_type(dt.clone())))
}

/// One group's running sum and count.
#[derive(Debug)]
struct Mean {
    shape: Shape,
    sum: i128,
    count: u64,
}

impl Accumulator for Mean {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let a = values[0].as_primitive::<Decimal128Type>();
        for v in a.iter().flatten() {
            self.sum = add(self.sum, v)?;
            self.count += 1;
        }
        Ok(())
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let a = values[0].as_primitive::<Decimal128Type>();
        for v in a.iter().flatten() {
            self.sum = add(self.sum, -v)?;
            self.count = self.count.saturating_sub(1);
        }
        Ok(())
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let counts = states[0].as_primitive::<UInt64Type>();
        let sums = states[1].as_primitive::<Decimal128Type>();
        for (c, s) in counts.iter().zip(sums.iter()) {
            self.count += c.unwrap_or(0);
            self.sum = add(self.sum, s.unwrap_or(0))?;
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::UInt64(Some(self.count)),
            ScalarValue::Decimal128(Some(self.sum), MAX_PRECISION, self.shape.input_scale),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Decimal128(
            mean(self.sum, self.count, self.shape)?,
            self.shape.precision,
            self.shape.scale,
        ))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
}

/// One group's distinct values (`avg(DISTINCT x)`).
#[derive(Debug)]
struct DistinctMean {
    shape: Shape,
    seen: HashSet<i128>,
}

impl Accumulator for DistinctMean {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let a = values[0].as_primitive::<Decimal128Type>();
        self.seen.extend(a.iter().flatten());
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let lists = states[0].as_list::<i32>();
        for list in lists.iter().flatten() {
            self.seen
                .extend(list.as_primitive::<Decimal128Type>().iter().flatten());
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let dt = self.shape.sum_type();
        let values = decimals(self.seen.iter().map(|v| Some(*v)), &dt)?;
        let list = ListArray::new(
            Arc::new(Field::new_list_field(dt, true)),
            OffsetBuffer::from_lengths([values.len()]),
            values,
            None,
        );
        Ok(vec![ScalarValue::List(Arc::new(list))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let mut sum = 0i128;
        for v in &self.seen {
            sum = add(sum, *v)?;
        }
        Ok(ScalarValue::Decimal128(
            mean(sum, self.seen.len() as u64, self.shape)?,
            self.shape.precision,
            self.shape.scale,
        ))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.seen.capacity() * std::mem::size_of::<i128>()
    }
}

/// Every group's running sum and count, for grouped means.
struct GroupMeans {
    shape: Shape,
    sums: Vec<i128>,
    counts: Vec<u64>,
}

impl GroupMeans {
    /// Room for `groups` groups.
    fn grow(&mut self, groups: usize) {
        self.sums.resize(groups, 0);
        self.counts.resize(groups, 0);
    }

    fn take(&mut self, emit_to: EmitTo) -> (Vec<i128>, Vec<u64>) {
        (
            emit_to.take_needed(&mut self.sums),
            emit_to.take_needed(&mut self.counts),
        )
    }
}

/// The rows a filter lets through.
fn passes(filter: Option<&BooleanArray>, i: usize) -> bool {
    filter.is_none_or(|f| f.is_valid(i) && f.value(i))
}

impl GroupsAccumulator for GroupMeans {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        let a = values[0].as_primitive::<Decimal128Type>();
        for (i, g) in group_indices.iter().enumerate() {
            if a.is_valid(i) && passes(opt_filter, i) {
                self.sums[*g] = add(self.sums[*g], a.value(i))?;
                self.counts[*g] += 1;
            }
        }
        Ok(())
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        let counts = values[0].as_primitive::<UInt64Type>();
        let sums = values[1].as_primitive::<Decimal128Type>();
        for (i, g) in group_indices.iter().enumerate() {
            if passes(opt_filter, i) {
                self.counts[*g] += if counts.is_valid(i) {
                    counts.value(i)
                } else {
                    0
                };
                let s = if sums.is_valid(i) { sums.value(i) } else { 0 };
                self.sums[*g] = add(self.sums[*g], s)?;
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let (sums, counts) = self.take(emit_to);
        let shape = self.shape;
        let values = sums
            .into_iter()
            .zip(counts)
            .map(|(s, c)| mean(s, c, shape))
            .collect::<Result<Vec<_>>>()?;
        decimals(values, &shape.result_type())
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let (sums, counts) = self.take(emit_to);
        let sums = decimals(sums.into_iter().map(Some), &self.shape.sum_type())?;
        Ok(vec![Arc::new(UInt64Array::from(counts)), sums])
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let a = values[0].as_primitive::<Decimal128Type>();
        let kept = |i: usize| a.is_valid(i) && passes(opt_filter, i);
        let counts: UInt64Array = (0..a.len()).map(|i| Some(u64::from(kept(i)))).collect();
        let sums = decimals(
            (0..a.len()).map(|i| Some(if kept(i) { a.value(i) } else { 0 })),
            &self.shape.sum_type(),
        )?;
        Ok(vec![Arc::new(counts), sums])
    }

    fn supports_convert_to_state(&self) -> bool {
        true
    }

    fn size(&self) -> usize {
        self.sums.capacity() * std::mem::size_of::<i128>()
            + self.counts.capacity() * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Decimal128Array;

    fn shape(p: u8, s: i8) -> Shape {
        Shape::of(&DataType::Decimal128(p, s)).unwrap()
    }

    fn text(sum: i128, count: u64, sh: Shape) -> String {
        let v = mean(sum, count, sh).unwrap().unwrap();
        decimal_text(v, sh.scale, display_scale(v, sh.scale, sh.input_scale))
    }

    #[test]
    fn means_round_and_show_as_postgres_does() {
        // numeric(12,2): sum 797.00 over 3 rows
        let sh = shape(12, 2);
        assert_eq!((sh.precision, sh.scale), (30, 20));
        assert_eq!(text(79_700, 3, sh), "265.6666666666666667");
        // 10 / 3 and 2 / 3 (integers)
        let ints = shape(10, 0);
        assert_eq!(text(10, 3, ints), "3.3333333333333333");
        assert_eq!(text(2, 3, ints), "0.66666666666666666667");
        assert_eq!(text(-2, 3, ints), "-0.66666666666666666667");
        assert_eq!(text(12_345_678, 1, ints), "12345678.000000000000");
        assert_eq!(text(5, 2, ints), "2.5000000000000000");
        assert_eq!(text(0, 2, ints), "0.00000000000000000000");
    }

    #[test]
    fn division_scale_is_postgres_select_div_scale() {
        // 1 / 1: the first digits are equal, so one more base-10000 digit.
        assert_eq!(division_scale(1, 0, 1), 20);
        assert_eq!(division_scale(10, 0, 3), 16);
        assert_eq!(division_scale(123_456, 0, 1), 12);
        // 0.50 / 1 (scale 2)
        assert_eq!(division_scale(50, 2, 1), 20);
        assert_eq!(division_scale(1, 30, 1), 48);
    }

    #[test]
    fn sums_past_38_digits_are_an_error() {
        let mut m = Mean {
            shape: shape(38, 0),
            sum: i128::MAX - 1,
            count: 1,
        };
        let a: ArrayRef =
            Arc::new(Decimal128Array::from(vec![10]).with_data_type(DataType::Decimal128(38, 0)));
        assert!(m.update_batch(&[a]).is_err());
    }
}
