//! The errors that stop a pipeline, as operators meet them: the one source of the error table in
//! docs/operations.md ("Errors that stop a pipeline, and what to do").
//!
//! Each entry names fragments of the message the code emits (`...` stands for any text), its
//! cause and its fix. A unit test keeps the three in step: the table in the docs is rendered from
//! this list (`SKIPPR_WRITE_DOCS=1 cargo test error_table` rewrites it), every fragment must occur
//! in an error message of the code, and every message built with `Error::source_err` or
//! `Error::unrepresentable` must match an entry here.

/// One documented error.
pub struct StopError {
    /// Fragments of the message, each with `...` where the message holds names or numbers; the
    /// docs show them joined by " / ".
    pub says: &'static [&'static str],
    /// Extra words after the fragments in the docs' first column, e.g. "(during a sync)".
    pub when: &'static str,
    pub cause: &'static str,
    pub fix: &'static str,
}

const RESNAPSHOT: &str = "`skipprd sync --pipeline P --resnapshot`";

/// The errors that stop `sync` (and a pipeline of `serve`), in the order the docs list them.
pub const STOP_ERRORS: &[StopError] = &[
    StopError {
        says: &["needs wal_level = logical"],
        when: "",
        cause: "the server is not set up for logical replication",
        fix: "`ALTER SYSTEM SET wal_level = logical;` and restart Postgres",
    },
    StopError {
        says: &["the change stream needs Postgres 14 or later"],
        when: "",
        cause: "the source runs Postgres 13, whose pgoutput cannot send logical messages",
        fix: "upgrade the server to Postgres 14 or later, or use `cdc_mode: snapshot_only`",
    },
    StopError {
        says: &["lacks the REPLICATION privilege"],
        when: "",
        cause: "the role cannot replicate",
        fix: "`ALTER ROLE ... WITH REPLICATION;`",
    },
    StopError {
        says: &["has no primary key and replica identity"],
        when: "",
        cause: "updates/deletes of the table cannot be applied",
        fix: "add a primary key, `ALTER TABLE ... REPLICA IDENTITY FULL;`, or list it under `append_only`",
    },
    StopError {
        says: &[
            "replica identity USING INDEX ... which does not include its primary key",
            "replica identity NOTHING",
        ],
        when: "",
        cause: "the old row Postgres sends with an UPDATE or DELETE would lack the key, so the row could not be found",
        fix: "`ALTER TABLE ... REPLICA IDENTITY DEFAULT;` (checked by `discover` and at every `sync` start)",
    },
    StopError {
        says: &["which does not include its key"],
        when: "(during a sync)",
        cause: "the replica identity was changed while the pipeline followed the table, and a change arrived without its key",
        fix: "`ALTER TABLE ... REPLICA IDENTITY DEFAULT;` then `skipprd sync --resnapshot`",
    },
    StopError {
        says: &["is marked append_only, but an"],
        when: "",
        cause: "an UPDATE or DELETE arrived for a table listed under `append_only`",
        fix: "give the table a primary key or `REPLICA IDENTITY FULL`, remove it from `append_only`, then `skipprd sync --resnapshot`",
    },
    StopError {
        says: &["names a row that Iceberg table ... does not hold"],
        when: "",
        cause: "an UPDATE or DELETE found no row to change: the table was changed by another writer, or changes were missed",
        fix: RESNAPSHOT,
    },
    StopError {
        says: &["is invalidated (wal_status = lost)"],
        when: "",
        cause: "Postgres removed WAL the slot still needed (see `max_slot_wal_keep_size`)",
        fix: RESNAPSHOT,
    },
    StopError {
        says: &[
            "replication slot ... no longer exists",
            "publication ... no longer exists",
            "was removed from publication",
        ],
        when: "",
        cause: "the source side was changed by hand; changes may have been missed",
        fix: "restore it, then `skipprd sync --pipeline P --resnapshot`",
    },
    StopError {
        says: &["has confirmed position ..., beyond everything this pipeline received"],
        when: "",
        cause: "the slot was recreated, or advanced by something other than skipprd: changes were lost",
        fix: RESNAPSHOT,
    },
    StopError {
        says: &["publish_via_partition_root is off"],
        when: "",
        cause: "a partitioned table is followed through a publication that publishes its partitions under their own names",
        fix: "run the `ALTER PUBLICATION` the message gives (and `--resnapshot` when it says so)",
    },
    StopError {
        says: &[
            "the change stream would not carry",
            "is a stored generated column",
            "is a virtual generated column",
            "with a column list that leaves out column",
            "with a row filter",
        ],
        when: "",
        cause: "a column the snapshot copies would arrive as NULL with every streamed change: a stored generated column before Postgres 18, a virtual generated column, or a column the publication's column list leaves out (or a row filter that leaves out rows)",
        fix: "leave it out with `pipelines.P.tables.T.exclude_columns: [column]`, or (a stored generated column) move to Postgres 18, or add the column to the publication's column list",
    },
    StopError {
        says: &["the publication changed while the pipeline ran"],
        when: "",
        cause: "a column list, a row filter or a change to generated columns on the publication while the pipeline ran: changes since then may lack the column",
        fix: "undo the publication change (or leave the column out with `exclude_columns`), then `skipprd sync --pipeline P --resnapshot`",
    },
    StopError {
        says: &["is a partition of ..., which is also in `tables:`"],
        when: "",
        cause: "a partition and its partitioned table are both listed",
        fix: "remove the partition from `tables:`",
    },
    StopError {
        says: &["is written by pipeline", "holds source table"],
        when: "",
        cause: "another pipeline or another source table writes the same Iceberg table",
        fix: "follow the table in one pipeline only, or give one of them another sink",
    },
    StopError {
        says: &["does not exist in the source database"],
        when: "",
        cause: "a followed table was dropped, or the user cannot see it",
        fix: "create it or grant access, or remove it from `tables:` (its Iceberg table and data stay)",
    },
    StopError {
        says: &["is not a table (relkind"],
        when: "",
        cause: "`tables:` names a view, a sequence or another relation that has no rows to replicate",
        fix: "remove it from `tables:`",
    },
    StopError {
        says: &[
            "the COPY stream of ... ended in the middle of a row",
            "a COPY row of ... has fewer columns than expected",
            "a COPY row of ... has more columns than expected",
        ],
        when: "",
        cause: "the snapshot's COPY was cut off, or the table changed shape while it was copied",
        fix: "run `sync` again (the snapshot starts over; nothing was committed)",
    },
    StopError {
        says: &[
            "has no Iceberg representation",
            "more than the ... the Iceberg column keeps",
            "the value is not UTF-8",
            "nothing of it was committed: update or delete the row at the source",
        ],
        when: "",
        cause: "a value that cannot be stored exactly (see [types.md](types.md)); nothing of the batch was committed and the change stays in the WAL",
        fix: "update or delete the row at the source and run `sync` again (the row's later version replaces the value before anything is written); for future rows, change the column type (e.g. declare `numeric(p,s)`)",
    },
    StopError {
        says: &["a key value is not UTF-8", "a key value cannot be read"],
        when: "",
        cause: "a key column holds a value that cannot be encoded as a row key",
        fix: "fix the row at the source, then `skipprd sync --resnapshot`",
    },
    StopError {
        says: &[
            "primary key column ... was renamed to",
            "primary key column ... was dropped",
            "changed incompatibly, and it is part of the key",
        ],
        when: "",
        cause: "the columns that identify rows changed, so earlier rows can no longer be matched with new changes",
        fix: "`skipprd sync --resnapshot`",
    },
    StopError {
        says: &["changed type again and its sibling column"],
        when: "",
        cause: "a column changed type incompatibly a second time, and its sibling column (see [schema-evolution.md](schema-evolution.md)) has a third type",
        fix: "`skipprd sync --resnapshot`",
    },
    StopError {
        says: &["carries no record of its source columns"],
        when: "",
        cause: "the Iceberg table was created by something other than skipprd, or its properties were removed",
        fix: "`skipprd sync --resnapshot`",
    },
    StopError {
        says: &["has equality deletes, which skipprd does not write or apply"],
        when: "",
        cause: "another engine wrote equality deletes into a table skipprd writes",
        fix: "let only skipprd write the table; `skipprd sync --resnapshot` rewrites it",
    },
    StopError {
        says: &[
            "is already running: its lease",
            "was just started by another skipprd",
        ],
        when: "",
        cause: "another `sync` or `serve` holds the pipeline's lease (S3 storage mode)",
        fix: "stop the other process, or, if it died, wait until its lease expires (`skippr.lease.expire_after`) and start again",
    },
    StopError {
        says: &[
            "stopped writing: its lease was last renewed",
            "its lease ... was taken over",
        ],
        when: "",
        cause: "this process could not renew its lease in time (storage unreachable, or the process paused), so it stopped before writing again",
        fix: "nothing is lost: the process that holds the lease carries on; check that the storage is reachable, or raise `skippr.lease.expire_after`",
    },
    StopError {
        says: &["the lease ... is damaged"],
        when: "",
        cause: "the lease object cannot be read",
        fix: "if no skipprd runs the pipeline, delete the object and start again",
    },
    StopError {
        says: &["is damaged at byte"],
        when: "",
        cause: "a WAL segment was altered on disk",
        fix: "restore the file, or `--resnapshot`",
    },
    StopError {
        says: &["gave up after ...s of retrying"],
        when: "(exit 75)",
        cause: "`sync` met the same transient fault for longer than `skippr.reconnect.give_up_after`",
        fix: "fix the cause (the source down, the disk full), run `sync` again; nothing was lost",
    },
    StopError {
        says: &["was written in WAL format ... by an earlier skipprd"],
        when: "",
        cause: "the WAL holds changes from before an upgrade, in a format this version does not read",
        fix: "with the earlier version, `skipprd sync --once` until the WAL folder is empty, then upgrade; or `--resnapshot` with this version",
    },
    StopError {
        says: &[
            "a change carries ... columns but the table's description in effect has",
            "a change in the WAL carries ... columns but its description has",
        ],
        when: "",
        cause: "a change and its relation description disagree; nothing after the last acknowledged change was acknowledged",
        fix: "restart; if it happens again, `--resnapshot`",
    },
    StopError {
        says: &["whether ... was renamed or dropped and another column added cannot be established"],
        when: "",
        cause: "a column was renamed (or dropped and another added) and the stream read it only after further DDL on the table",
        fix: "`--resnapshot`",
    },
    StopError {
        says: &["which no longer exists in the source"],
        when: "(a type oid)",
        cause: "a column's type was dropped before the stream read changes that use it",
        fix: "`--resnapshot`",
    },
];

/// The docs' table, as Markdown.
pub fn render_table() -> String {
    let mut out = String::from("| message says | cause | fix |\n|---|---|---|\n");
    for e in STOP_ERRORS {
        let says = e
            .says
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(" / ");
        let first = if e.when.is_empty() {
            says
        } else {
            format!("{says} {}", e.when)
        };
        out.push_str(&format!("| {first} | {} | {} |\n", e.cause, e.fix));
    }
    out
}

#[cfg(test)]
mod tests;
