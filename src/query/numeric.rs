//! Queries, numeric results as Postgres computes them: `avg` of a `numeric` column. The
//! engine's average of a decimal keeps four more digits than its input and cuts the rest
//! (`265.622915`); Postgres divides to at least 16 significant digits and rounds
//! (`265.6229159212880143`), and BI tools show and compare those digits. An analyzer rule
//! gives every `avg` of a decimal this file's accumulator (named `avg`, so plans and result
//! names read as before).

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Decimal128Type, Field, FieldRef, UInt64Type};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ExprSchema, ScalarValue};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Expr, ExprSchemable, LogicalPlan, Signature,
    Volatility,
};
use datafusion::optimizer::AnalyzerRule;

/// Postgres's least number of significant digits in a quotient (`NUMERIC_MIN_SIG_DIGITS`).
const MIN_SIG_DIGITS: i32 = 16;
/// The largest scale of an average: it leaves 18 integer digits to a `numeric(38, _)`.
const MAX_AVG_SCALE: i8 = 20;

/// `avg` of a `numeric` (an Arrow decimal) as Postgres computes it.
#[derive(Debug, PartialEq, Eq, Hash)]
struct NumericAvg {
    signature: Signature,
}

impl NumericAvg {
    fn new() -> Self {
        Self {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

/// The result scale of an average over a decimal of `(precision, scale)`: room for every
/// integer digit the input can have, and Postgres's digits where that leaves room.
fn result_scale(precision: u8, scale: i8) -> i8 {
    let integer_digits = (precision as i16 - scale as i16).max(1);
    let room = (38 - integer_digits).clamp(0, 38) as i8;
    scale.max(MAX_AVG_SCALE.min(room))
}

fn input_decimal(dt: &DataType) -> DfResult<(u8, i8)> {
    match dt {
        DataType::Decimal128(p, s) => Ok((*p, *s)),
        other => Err(DataFusionError::Plan(format!(
            "the numeric average takes a decimal, not {other}"
        ))),
    }
}

impl AggregateUDFImpl for NumericAvg {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "avg"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        let (p, s) = input_decimal(args.first().unwrap_or(&DataType::Null))?;
        Ok(DataType::Decimal128(38, result_scale(p, s)))
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        let (p, s) = input_decimal(
            args.expr_fields
                .first()
                .map(|f| f.data_type())
                .unwrap_or(&DataType::Null),
        )?;
        Ok(Box::new(NumericAvgAccumulator {
            sum: 0,
            count: 0,
            scale: s,
            out_scale: result_scale(p, s),
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        let (_, s) = input_decimal(args.input_fields[0].data_type())?;
        Ok(vec![
            Arc::new(Field::new("sum", DataType::Decimal128(38, s), true)),
            Arc::new(Field::new("count", DataType::UInt64, true)),
        ])
    }
}

#[derive(Debug)]
struct NumericAvgAccumulator {
    /// The sum, at the input's scale.
    sum: i128,
    count: u64,
    scale: i8,
    out_scale: i8,
}

fn overflow() -> DataFusionError {
    DataFusionError::Execution(
        "numeric field overflow: the sum of avg() does not fit in 38 digits".into(),
    )
}

impl NumericAvgAccumulator {
    fn add(&mut self, sum: i128, count: u64) -> DfResult<()> {
        self.sum = self.sum.checked_add(sum).ok_or_else(overflow)?;
        self.count += count;
        Ok(())
    }
}

/// The base-10000 weight and first digit of `|v| / 10^scale`, as Postgres's numeric holds it
/// (0 and 0 for zero).
fn weight_and_first(v: u128, scale: i8) -> (i32, u128) {
    if v == 0 {
        return (0, 0);
    }
    let digits = v.to_string();
    // Decimal exponent of the leading digit.
    let exp = digits.len() as i32 - 1 - scale as i32;
    let weight = exp.div_euclid(4);
    // The first base-10000 digit: the value's digits from 10^(4*weight) up.
    let shift = 4 * weight + scale as i32;
    let first = if shift >= 0 {
        v / 10u128.pow(shift as u32)
    } else {
        v * 10u128.pow((-shift) as u32)
    };
    (weight, first % 10000)
}

/// Postgres's scale for `sum / count` (`select_div_scale`), at most `cap`.
fn division_scale(sum: u128, scale: i8, count: u64, cap: i8) -> i8 {
    let (w1, f1) = weight_and_first(sum, scale);
    let (w2, f2) = weight_and_first(count as u128, 0);
    let mut qweight = w1 - w2;
    if f1 <= f2 {
        qweight -= 1;
    }
    let rscale = (MIN_SIG_DIGITS - qweight * 4).max(scale as i32).max(0);
    rscale.min(cap as i32) as i8
}

/// `n / 10^scale` divided by `d`, rounded half away from zero to `digits` decimals, as an
/// integer at that scale (`None` when it does not fit).
fn divide(n: u128, scale: i8, d: u128, digits: i8) -> Option<u128> {
    let mut q = n / d;
    let mut rem = n % d;
    // One digit more than asked, for rounding; `scale` of them are the input's own.
    let extra = digits as i32 - scale as i32 + 1;
    for _ in 0..extra.max(0) {
        q = q.checked_mul(10)?.checked_add((rem * 10) / d)?;
        rem = (rem * 10) % d;
    }
    if extra <= 0 {
        // Fewer decimals than the input has (never chosen, kept exact for safety).
        q /= 10u128.pow((1 - extra) as u32);
        return Some(q);
    }
    let up = q % 10 >= 5;
    Some(q / 10 + up as u128)
}

impl Accumulator for NumericAvgAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let a = values[0].as_primitive::<Decimal128Type>();
        let mut sum: i128 = 0;
        for v in a.iter().flatten() {
            sum = sum.checked_add(v).ok_or_else(overflow)?;
        }
        let count = (a.len() - a.null_count()) as u64;
        self.add(sum, count)
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let sums = states[0].as_primitive::<Decimal128Type>();
        let counts = states[1].as_primitive::<UInt64Type>();
        for i in 0..sums.len() {
            if sums.is_valid(i) && counts.is_valid(i) {
                self.add(sums.value(i), counts.value(i))?;
            }
        }
        Ok(())
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::Decimal128(Some(self.sum), 38, self.scale),
            ScalarValue::UInt64(Some(self.count)),
        ])
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        if self.count == 0 {
            return Ok(ScalarValue::Decimal128(None, 38, self.out_scale));
        }
        let n = self.sum.unsigned_abs();
        let d = self.count as u128;
        let digits = division_scale(n, self.scale, self.count, self.out_scale);
        let q = divide(n, self.scale, d, digits).ok_or_else(overflow)?;
        let padded = q
            .checked_mul(10u128.pow((self.out_scale - digits) as u32))
            .and_then(|v| i128::try_from(v).ok())
            .ok_or_else(overflow)?;
        let signed = if self.sum < 0 { -padded } else { padded };
        Ok(ScalarValue::Decimal128(Some(signed), 38, self.out_scale))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
}

/// Gives every `avg` of a decimal the numeric average above.
#[derive(Debug)]
pub struct NumericAverages {
    avg: Arc<AggregateUDF>,
}

impl Default for NumericAverages {
    fn default() -> Self {
        Self {
            avg: Arc::new(AggregateUDF::from(NumericAvg::new())),
        }
    }
}

impl NumericAverages {
    fn rewrite(&self, e: Expr, schema: &dyn ExprSchema) -> DfResult<Transformed<Expr>> {
        let Expr::AggregateFunction(f) = &e else {
            return Ok(Transformed::no(e));
        };
        let is_avg = f.func.name() == "avg"
            && f.func
                .inner()
                .as_any()
                .downcast_ref::<NumericAvg>()
                .is_none()
            && !f.params.distinct
            && f.params.args.len() == 1;
        if !is_avg {
            return Ok(Transformed::no(e));
        }
        let Ok(DataType::Decimal128(..)) = f.params.args[0].get_type(schema) else {
            return Ok(Transformed::no(e));
        };
        let Expr::AggregateFunction(f) = e else {
            return Err(DataFusionError::Internal("matched above".into()));
        };
        Ok(Transformed::yes(Expr::AggregateFunction(
            AggregateFunction {
                func: self.avg.clone(),
                params: f.params,
            },
        )))
    }
}

impl AnalyzerRule for NumericAverages {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            let inputs = node.inputs();
            let schema = match inputs.as_slice() {
                [input] => Arc::clone(input.schema()),
                [] => Arc::new(DFSchema::empty()),
                _ => return Ok(Transformed::no(node)),
            };
            let rewritten =
                node.map_expressions(|e| e.transform_up(|e| self.rewrite(e, schema.as_ref())))?;
            if !rewritten.transformed {
                return Ok(rewritten);
            }
            // The aggregate's output type changed: its schema is computed again.
            rewritten.map_data(|n| n.recompute_schema())
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "skippr_numeric_averages"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avg_of(values: &[i128], scale: i8) -> DfResult<String> {
        let mut acc = NumericAvgAccumulator {
            sum: 0,
            count: 0,
            scale,
            out_scale: result_scale(12, scale),
        };
        let a: ArrayRef = Arc::new(
            arrow::array::Decimal128Array::from(values.to_vec())
                .with_precision_and_scale(12, scale)?,
        );
        acc.update_batch(&[a])?;
        let out = acc.evaluate()?.to_array()?;
        let text = arrow::compute::cast(&out, &DataType::Utf8)?;
        Ok(text.as_string::<i32>().value(0).to_string())
    }

    #[test]
    fn averages_have_postgres_digits() -> DfResult<()> {
        // What Postgres 15 answers for the same averages, padded to the result's scale:
        // avg(1.00, 2.00, 2.00) = 1.6666666666666667 (16 decimals, rounded).
        assert_eq!(avg_of(&[100, 200, 200], 2)?, "1.66666666666666670000");
        assert_eq!(
            avg_of(&[26562, 26563, 26563], 2)?,
            "265.62666666666666670000"
        );
        // The sum's first base-10000 digit (3) is not above the count's (3): 16 decimals.
        assert_eq!(
            avg_of(&[1234560, 1234561, 1234561], 2)?,
            "12345.60666666666666670000"
        );
        // 9999.99 twice: 9999.9900000000000000.
        assert_eq!(avg_of(&[999999, 999999], 2)?, "9999.99000000000000000000");
        assert_eq!(avg_of(&[-100, -200, -200], 2)?, "-1.66666666666666670000");
        assert_eq!(avg_of(&[5], 2)?, "0.05000000000000000000");
        Ok(())
    }
}
