//! Gateway, Postgres imitation: the one way the gateway defines a SQL function (catalog
//! functions, constants, per-session lookups). A function is its name, its result type and
//! a closure over its arguments, so each one states only what it computes.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray};
use arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TypeSignature, Volatility,
};

/// What a function computes from its arguments.
type Body = Arc<dyn Fn(&ScalarFunctionArgs) -> DfResult<ColumnarValue> + Send + Sync>;

/// The field a function returns, from its arguments' fields (its type, and the Postgres
/// type its field metadata names).
pub type ReturnField = Arc<dyn Fn(&[FieldRef]) -> DfResult<Field> + Send + Sync>;

/// What a function returns: one type, or a field that depends on the arguments'.
enum Returns {
    Type(DataType),
    Field(ReturnField),
}

/// A function of the gateway: any arguments, its result, a closure.
struct PgFunction {
    name: String,
    signature: Signature,
    returns: Returns,
    body: Body,
}

impl std::fmt::Debug for PgFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgFunction({})", self.name)
    }
}

// Functions are told apart by name: a session never holds two of the same name.
impl PartialEq for PgFunction {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for PgFunction {}

impl std::hash::Hash for PgFunction {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state)
    }
}

impl ScalarUDFImpl for PgFunction {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        match &self.returns {
            Returns::Type(t) => Ok(t.clone()),
            Returns::Field(_) => Err(DataFusionError::Internal(format!(
                "{} has its result field from its arguments",
                self.name
            ))),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        match &self.returns {
            Returns::Type(t) => Ok(Arc::new(Field::new(self.name(), t.clone(), true))),
            Returns::Field(f) => Ok(Arc::new(f(args.arg_fields)?)),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        (self.body)(&args)
    }
}

/// A function named `name` returning `returns`, computed by `body` (stable: the same
/// arguments give the same answer within a statement).
pub fn function(
    name: &str,
    returns: DataType,
    body: impl Fn(&ScalarFunctionArgs) -> DfResult<ColumnarValue> + Send + Sync + 'static,
) -> ScalarUDF {
    with_volatility(name, returns, Volatility::Stable, body)
}

/// [`function`] with another volatility (`set_config` changes the session: volatile).
pub fn with_volatility(
    name: &str,
    returns: DataType,
    volatility: Volatility,
    body: impl Fn(&ScalarFunctionArgs) -> DfResult<ColumnarValue> + Send + Sync + 'static,
) -> ScalarUDF {
    ScalarUDF::from(PgFunction {
        name: name.to_string(),
        // Any arguments, none included (`version()`).
        signature: Signature::one_of(
            vec![TypeSignature::Nullary, TypeSignature::VariadicAny],
            volatility,
        ),
        returns: Returns::Type(returns),
        body: Arc::new(body),
    })
}

/// A function whose result field (its type and Postgres type) `returns` computes from its
/// arguments' fields (immutable: the same arguments give the same answer).
pub fn field_function(
    name: &str,
    returns: impl Fn(&[FieldRef]) -> DfResult<Field> + Send + Sync + 'static,
    body: impl Fn(&ScalarFunctionArgs) -> DfResult<ColumnarValue> + Send + Sync + 'static,
) -> ScalarUDF {
    ScalarUDF::from(PgFunction {
        name: name.to_string(),
        signature: Signature::new(TypeSignature::VariadicAny, Volatility::Immutable),
        returns: Returns::Field(Arc::new(returns)),
        body: Arc::new(body),
    })
}

/// A function with one answer whatever its arguments.
pub fn constant(name: &str, value: ScalarValue) -> ScalarUDF {
    let returns = value.data_type();
    function(name, returns, move |_| {
        Ok(ColumnarValue::Scalar(value.clone()))
    })
}

/// Every argument as an array of the call's rows.
pub fn arrays(args: &ScalarFunctionArgs) -> DfResult<Vec<ArrayRef>> {
    args.args
        .iter()
        .map(|a| a.to_array(args.number_rows))
        .collect()
}

/// Argument `i` as an array of the call's rows; an error naming `function` when it is
/// missing.
pub fn arg(args: &ScalarFunctionArgs, i: usize, function: &str) -> DfResult<ArrayRef> {
    match args.args.get(i) {
        Some(a) => a.to_array(args.number_rows),
        None => Err(DataFusionError::Plan(format!(
            "{function}() needs at least {} argument(s)",
            i + 1
        ))),
    }
}

/// Argument `i` as text (NULL stays NULL).
pub fn text_arg(args: &ScalarFunctionArgs, i: usize, function: &str) -> DfResult<ArrayRef> {
    text(&arg(args, i, function)?)
}

/// An array as text (NULL stays NULL).
pub fn text(a: &ArrayRef) -> DfResult<ArrayRef> {
    Ok(arrow::compute::cast(a, &DataType::Utf8)?)
}

/// Argument `i` as 64-bit integers (an oid, a column number).
pub fn int_arg(
    args: &ScalarFunctionArgs,
    i: usize,
    function: &str,
) -> DfResult<arrow::array::Int64Array> {
    let a = arg(args, i, function)?;
    let a = arrow::compute::cast(&a, &DataType::Int64)?;
    Ok(a.as_primitive::<arrow::datatypes::Int64Type>().clone())
}
