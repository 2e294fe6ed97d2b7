//! Dynamic broker configs: the values set with AlterConfigs / IncrementalAlterConfigs on
//! the BROKER resource, applied over the static configuration (Kafka's precedence: this
//! node's dynamic value > the cluster-wide dynamic default > static > default).
//!
//! Where they live depends on the deployment. A single node persists its set in
//! `<data dir>/dynamic-broker.properties`, and the empty resource name (Kafka's
//! `--entity-default`) and its own id name that one set. In a cluster they are metadata,
//! as in KRaft: the controller's catalogue holds the cluster default and each node's own
//! set ([`crate::metadata::Catalog::broker_configs`]), so a change made through any node
//! reaches every node, and survives a node's restart through the quorum's log.
//!
//! Which keys may be set, and which of them take effect, is [`super::keys::dynamic_kind`]'s
//! decision. The store is read when topic defaults are built (a partition opens or is
//! reconfigured, DescribeConfigs) — never on the produce or fetch path — so a lock is
//! cheap here and shards on other threads see a change at once.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError, RwLock};

use super::{ConfigError, Properties};

/// File name of the persisted dynamic configs inside the data dir.
pub const FILE_NAME: &str = "dynamic-broker.properties";

/// The dynamic broker configs of this node.
#[derive(Default)]
pub struct DynamicConfigs {
    /// Where they persist; `None` keeps them in memory only (tests).
    path: Option<PathBuf>,
    values: RwLock<BTreeMap<String, String>>,
    /// Held across a change's read, write and publish: one writer of the file at a time.
    writing: Mutex<()>,
    /// In a cluster: where the catalogue's layers are read (the file is not used).
    cluster: OnceLock<Box<dyn Fn() -> Layers + Send + Sync>>,
}

impl std::fmt::Debug for DynamicConfigs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamicConfigs")
            .field("path", &self.path)
            .field("cluster", &self.cluster.get().is_some())
            .finish_non_exhaustive()
    }
}

/// A cluster's dynamic broker configs as one node sees them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Layers {
    /// The cluster-wide default (resource name "").
    pub cluster: BTreeMap<String, String>,
    /// This node's own (resource name: its id), over the default.
    pub node: BTreeMap<String, String>,
}

/// Which layer a dynamic value comes from (DescribeConfigs' source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// Set for this node (or, on a single node, for the node or the default alike).
    Node,
    /// The cluster-wide default.
    ClusterDefault,
}

impl DynamicConfigs {
    /// Loads `data_dir`'s stored dynamic configs (none if the file does not exist yet).
    pub fn load(data_dir: &Path) -> Result<DynamicConfigs, ConfigError> {
        let path = data_dir.join(FILE_NAME);
        let values = if path.exists() {
            let props = Properties::load(&path)?;
            props
                .keys()
                .filter_map(|k| props.get(k).map(|v| (k.to_string(), v.to_string())))
                .collect()
        } else {
            BTreeMap::new()
        };
        Ok(DynamicConfigs {
            path: Some(path),
            values: RwLock::new(values),
            writing: Mutex::new(()),
            cluster: OnceLock::new(),
        })
    }

    /// From now on the configs are the cluster's: `layers` reads them from the current
    /// catalogue. Values this node's file held are not used any more (said once, here).
    pub fn follow_cluster(&self, layers: Box<dyn Fn() -> Layers + Send + Sync>) {
        let left = self.read().len();
        if left > 0 {
            tracing::warn!(
                "{FILE_NAME} holds {left} dynamic broker configs from running alone; in a \
                 cluster the controller's are used: set them again with the admin API"
            );
        }
        if self.cluster.set(layers).is_err() {
            tracing::warn!("dynamic broker configs already follow the cluster");
        }
    }

    /// Whether the configs are the cluster's (changed through the controller).
    pub fn in_cluster(&self) -> bool {
        self.cluster.get().is_some()
    }

    /// The cluster's layers (`None` on a single node).
    pub fn layers(&self) -> Option<Layers> {
        self.cluster.get().map(|read| read())
    }

    /// The dynamic value of `key`, if one is set.
    pub fn get(&self, key: &str) -> Option<String> {
        match self.layers() {
            Some(l) => l.node.get(key).or_else(|| l.cluster.get(key)).cloned(),
            None => self.read().get(key).cloned(),
        }
    }

    /// Every dynamic value in force.
    pub fn all(&self) -> BTreeMap<String, String> {
        self.all_with_layer()
            .into_iter()
            .map(|(k, (v, _))| (k, v))
            .collect()
    }

    /// Every dynamic value in force, with the layer it comes from.
    pub fn all_with_layer(&self) -> BTreeMap<String, (String, Layer)> {
        let Some(l) = self.layers() else {
            let values = self.read();
            return values
                .iter()
                .map(|(k, v)| (k.clone(), (v.clone(), Layer::Node)))
                .collect();
        };
        let mut all: BTreeMap<String, (String, Layer)> = l
            .cluster
            .into_iter()
            .map(|(k, v)| (k, (v, Layer::ClusterDefault)))
            .collect();
        all.extend(l.node.into_iter().map(|(k, v)| (k, (v, Layer::Node))));
        all
    }

    /// Replaces a single node's whole set: written to disk first (temp file, fsync,
    /// rename, fsync of the dir), then visible. Blocking I/O: call it off a shard's thread.
    /// (A cluster's sets change through the controller.)
    pub fn replace(&self, values: BTreeMap<String, String>) -> std::io::Result<()> {
        let _one_writer = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        self.store(values)
    }

    /// Applies the change from `old` to `new` (the keys it sets or removes) to the set as
    /// it is now, and persists the result, which it returns. Changes from several shards'
    /// clients at once are taken one at a time, each over the one before: none is lost,
    /// and the file is never written by two threads. Blocking I/O, as [`Self::replace`].
    pub fn change(
        &self,
        old: &BTreeMap<String, String>,
        new: &BTreeMap<String, String>,
    ) -> std::io::Result<BTreeMap<String, String>> {
        let _one_writer = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let values = replay(old, new, &self.read());
        self.store(values.clone())?;
        Ok(values)
    }

    fn store(&self, values: BTreeMap<String, String>) -> std::io::Result<()> {
        if let Some(path) = &self.path {
            write_atomically(path, &values)?;
        }
        *self.values.write().unwrap_or_else(PoisonError::into_inner) = values;
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, String>> {
        self.values.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `current` with the difference between `old` and `new` applied: the keys the change
/// set or removed, and nothing else, so a change made meanwhile to other keys stays.
pub fn replay(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
    current: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = current.clone();
    for k in old.keys().filter(|k| !new.contains_key(*k)) {
        out.remove(k);
    }
    for (k, v) in new.iter().filter(|(k, v)| old.get(*k) != Some(*v)) {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// Whether `text` can be a key or value of the properties file as it is (nothing is
/// escaped): one line, not ending in an odd number of backslashes (the reader would
/// continue it on the next line, swallowing the next key), no blanks at either end (the
/// reader trims them), and no separator in a key.
pub fn storable(text: &str, key: bool) -> bool {
    let breaks_line = text.contains(['\n', '\r']);
    let trailing = text.len() - text.trim_end_matches('\\').len();
    let continues = trailing % 2 == 1;
    let trimmed = text.trim() != text;
    let breaks_key = key && text.contains(['=', ':', '#', '!']);
    !(breaks_line || continues || trimmed || breaks_key)
}

fn write_atomically(path: &Path, values: &BTreeMap<String, String>) -> std::io::Result<()> {
    let mut text = String::from("# Dynamic broker configs set through the Kafka admin API.\n");
    for (k, v) in values {
        text.push_str(&format!("{k}={v}\n"));
    }
    let tmp = path.with_extension("properties.tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_persists_and_load_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = DynamicConfigs::load(dir.path()).expect("load empty");
        assert!(d.all().is_empty());
        let mut v = BTreeMap::new();
        v.insert("log.retention.ms".to_string(), "1234".to_string());
        d.replace(v.clone()).expect("persist");
        assert_eq!(d.get("log.retention.ms").as_deref(), Some("1234"));
        let again = DynamicConfigs::load(dir.path()).expect("reload");
        assert_eq!(again.all(), v);
    }

    #[test]
    fn changes_from_several_threads_at_once_all_survive_a_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = std::sync::Arc::new(DynamicConfigs::load(dir.path()).expect("load empty"));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let d = d.clone();
                std::thread::spawn(move || {
                    let old = d.all();
                    let mut new = old.clone();
                    new.insert(format!("background.threads.{i}"), i.to_string());
                    d.change(&old, &new).expect("persist");
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let again = DynamicConfigs::load(dir.path()).expect("reload");
        assert_eq!(again.all().len(), 8, "{:?}", again.all());
    }

    #[test]
    fn a_line_break_or_separator_cannot_be_stored() {
        assert!(storable("ssl.cipher.suites", true));
        assert!(storable("a=b:c", false));
        assert!(!storable("ssl.x\ny", true));
        assert!(!storable("1\nlog.segment.bytes=5", false));
        assert!(!storable("a=b", true));
        assert!(!storable("abc\\", false), "would continue on the next line");
        assert!(
            storable("abc\\\\", false),
            "an escaped backslash ends the line"
        );
        assert!(!storable(" padded", false));
    }

    #[test]
    fn a_value_ending_in_a_backslash_cannot_swallow_the_next_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = DynamicConfigs::load(dir.path()).expect("load empty");
        let values = BTreeMap::from([
            ("a.password".to_string(), "abc\\\\".to_string()),
            ("log.retention.ms".to_string(), "2592000000".to_string()),
        ]);
        assert!(values.values().all(|v| storable(v, false)));
        d.replace(values.clone()).expect("persist");
        assert_eq!(
            DynamicConfigs::load(dir.path()).expect("reload").all(),
            values
        );
    }

    #[test]
    fn in_a_cluster_the_nodes_value_wins_over_the_default_and_the_file_is_not_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = DynamicConfigs::load(dir.path()).expect("load empty");
        let file = BTreeMap::from([("log.retention.ms".to_string(), "1".to_string())]);
        d.replace(file).expect("persist");
        d.follow_cluster(Box::new(|| Layers {
            cluster: BTreeMap::from([
                ("log.retention.ms".to_string(), "2".to_string()),
                ("log.segment.bytes".to_string(), "3".to_string()),
            ]),
            node: BTreeMap::from([("log.segment.bytes".to_string(), "4".to_string())]),
        }));
        assert!(d.in_cluster());
        assert_eq!(d.get("log.retention.ms").as_deref(), Some("2"));
        assert_eq!(d.get("log.segment.bytes").as_deref(), Some("4"));
        let all = d.all_with_layer();
        assert_eq!(
            all["log.retention.ms"],
            ("2".to_string(), Layer::ClusterDefault)
        );
        assert_eq!(all["log.segment.bytes"], ("4".to_string(), Layer::Node));
    }
}
