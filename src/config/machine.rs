//! Configuration, the machine's defaults: the memory and cores this process may use, for the
//! defaults of `skippr.query` (`max_memory`, `max_concurrent_statements`, `target_partitions`).
//! In a container the memory is the cgroup's limit, not the host's: half of a 64 GiB host is
//! no default for a pod limited to 4 GiB.

use std::path::Path;

/// `skippr.query.max_memory` by default: half of the memory this process may use (the
/// machine's, or its cgroup's limit when lower; 4 GiB where neither can be read).
pub fn default_max_memory() -> usize {
    let bytes = usable_memory(Path::new("/"));
    match bytes {
        Some(b) => usize::try_from(b / 2).unwrap_or(usize::MAX),
        None => 4 << 30,
    }
}

/// `skippr.query.max_concurrent_statements` by default: twice the cores.
pub fn default_max_concurrent_statements() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()) * 2
}

/// Default `skippr.query.target_partitions`: twice the cores this process may use.
pub fn default_target_partitions() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()) * 2
}

/// The memory this process may use, in bytes: the lower of the machine's (`MemTotal`) and its
/// cgroup's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`), read under `root`.
fn usable_memory(root: &Path) -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let total = read("proc/meminfo").and_then(|m| mem_total(&m));
    let limit = read("proc/self/cgroup").and_then(|c| {
        cgroup_limit_paths(&c)
            .into_iter()
            .find_map(|p| read(&p).and_then(|v| parse_limit(&v)))
    });
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

/// `MemTotal` of /proc/meminfo, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .map(|kib| kib.saturating_mul(1024))
}

/// The files that may hold this process's cgroup memory limit (relative to the root), most
/// specific first, from /proc/self/cgroup.
fn cgroup_limit_paths(cgroup: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let path = path.trim().trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2: one unified hierarchy.
            if !path.is_empty() {
                out.push(format!("sys/fs/cgroup/{path}/memory.max"));
            }
            out.push("sys/fs/cgroup/memory.max".to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            if !path.is_empty() {
                out.push(format!("sys/fs/cgroup/memory/{path}/memory.limit_in_bytes"));
            }
            out.push("sys/fs/cgroup/memory/memory.limit_in_bytes".to_string());
        }
    }
    out
}

/// A cgroup limit in bytes; `None` for no limit (`max`, or v1's page-rounded `i64::MAX`).
fn parse_limit(text: &str) -> Option<u64> {
    let v = text.trim().parse::<u64>().ok()?;
    (v < 1 << 60).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    const MEMINFO: &str = "MemTotal:       65536000 kB\nMemFree:         1000 kB\n";

    #[test]
    fn a_cgroup_v2_limit_below_the_machine_wins() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "proc/meminfo", MEMINFO);
        write(d.path(), "proc/self/cgroup", "0::/kubepods/pod1/c1\n");
        write(
            d.path(),
            "sys/fs/cgroup/kubepods/pod1/c1/memory.max",
            "4294967296\n",
        );
        assert_eq!(usable_memory(d.path()), Some(4 << 30));
    }

    #[test]
    fn no_limit_leaves_the_machines_memory() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "proc/meminfo", MEMINFO);
        write(d.path(), "proc/self/cgroup", "0::/\n");
        write(d.path(), "sys/fs/cgroup/memory.max", "max\n");
        assert_eq!(usable_memory(d.path()), Some(65_536_000 * 1024));
    }

    #[test]
    fn a_cgroup_v1_limit_is_read_and_its_unlimited_value_ignored() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "proc/meminfo", MEMINFO);
        write(
            d.path(),
            "proc/self/cgroup",
            "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n",
        );
        write(
            d.path(),
            "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
            "2147483648\n",
        );
        assert_eq!(usable_memory(d.path()), Some(2 << 30));
        write(
            d.path(),
            "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        assert_eq!(usable_memory(d.path()), Some(65_536_000 * 1024));
    }

    #[test]
    fn nothing_readable_gives_none() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(usable_memory(d.path()), None);
    }
}
