//! Queries, the committed side: a lookup by key (`k = 5`, `k IN (...)`) plans from the
//! snapshot's cached listing, not Iceberg's planning, and skips the data files whose
//! partition cannot hold one of the keys: a partition field computed from the key column
//! (identity, bucket[N], truncate[W]) must take the value the key gives it, in the file's
//! own spec (a table may hold files of several specs).

use std::collections::{HashMap, HashSet};

use iceberg::spec::{Datum, Literal, PrimitiveLiteral, Struct, TableMetadata, Transform};
use iceberg::transform::create_transform_function;

/// For each partition spec of a table, the partition fields computed from the key column,
/// each with the values the looked-up keys give it.
#[derive(Debug, Default)]
pub(super) struct KeyPartitions {
    by_spec: HashMap<i32, Vec<(usize, HashSet<i64>)>>,
}

impl KeyPartitions {
    /// The partition values the integer key column `field` takes for `keys`, per spec.
    pub fn new(meta: &TableMetadata, field: i32, keys: &[i64]) -> Self {
        let mut by_spec = HashMap::new();
        for spec in meta.partition_specs_iter() {
            let mut fields = Vec::new();
            for (i, pf) in spec.fields().iter().enumerate() {
                if pf.source_id != field
                    || !matches!(
                        pf.transform,
                        Transform::Identity | Transform::Bucket(_) | Transform::Truncate(_)
                    )
                {
                    continue;
                }
                let Ok(func) = create_transform_function(&pf.transform) else {
                    continue;
                };
                // Every key's value, or the field is not used (a key it cannot transform
                // could be anywhere).
                let values: Option<HashSet<i64>> = keys
                    .iter()
                    .map(|k| {
                        func.transform_literal(&Datum::long(*k))
                            .ok()
                            .flatten()
                            .and_then(|d| int(d.literal()))
                    })
                    .collect();
                if let Some(values) = values {
                    fields.push((i, values));
                }
            }
            if !fields.is_empty() {
                by_spec.insert(spec.spec_id(), fields);
            }
        }
        Self { by_spec }
    }

    /// Whether a file of spec `spec_id` and partition `partition` may hold one of the keys.
    pub fn may_hold(&self, spec_id: i32, partition: &Struct) -> bool {
        let Some(fields) = self.by_spec.get(&spec_id) else {
            return true;
        };
        fields.iter().all(|(i, values)| {
            match partition.fields().get(*i) {
                Some(Some(Literal::Primitive(p))) => int(p).is_none_or(|v| values.contains(&v)),
                // A missing or odd value decides nothing.
                _ => true,
            }
        })
    }
}

fn int(p: &PrimitiveLiteral) -> Option<i64> {
    match p {
        PrimitiveLiteral::Int(v) => Some(i64::from(*v)),
        PrimitiveLiteral::Long(v) => Some(*v),
        _ => None,
    }
}
