//! Dynamic broker configs: the values set with AlterConfigs / IncrementalAlterConfigs on
//! the BROKER resource, persisted in `<data dir>/dynamic-broker.properties` and applied
//! over the static configuration (Kafka's precedence: dynamic > static > default).
//!
//! Which keys may be set, and which of them take effect, is [`super::keys::dynamic_kind`]'s
//! decision. The store is read when topic defaults are built (a partition opens or is
//! reconfigured, DescribeConfigs) — never on the produce or fetch path — so a lock is
//! cheap here and shards on other threads see a change at once.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use super::{ConfigError, Properties};

/// File name of the persisted dynamic configs inside the data dir.
pub const FILE_NAME: &str = "dynamic-broker.properties";

/// The dynamic broker configs of this node.
#[derive(Debug, Default)]
pub struct DynamicConfigs {
    /// Where they persist; `None` keeps them in memory only (tests).
    path: Option<PathBuf>,
    values: RwLock<BTreeMap<String, String>>,
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
        })
    }

    /// The dynamic value of `key`, if one is set.
    pub fn get(&self, key: &str) -> Option<String> {
        self.read().get(key).cloned()
    }

    /// Every dynamic value.
    pub fn all(&self) -> BTreeMap<String, String> {
        self.read().clone()
    }

    /// Replaces the whole set: written to disk first (temp file, fsync, rename, fsync of
    /// the dir), then visible. Blocking I/O: call it off a shard's thread.
    pub fn replace(&self, values: BTreeMap<String, String>) -> std::io::Result<()> {
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
}
