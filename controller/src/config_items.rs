//! The dataplane config as shared, digested items: what the translate cache keeps and hands
//! to the pusher, so that neither of them copies, compares or re-serializes what did not
//! change.
//!
//! A [`ConfigItems`] holds the settings and every listener, virtual host and backend behind
//! an `Arc`, each with its digest ([`sweety_config::delta::Digests`] semantics: SHA-256 of the
//! item's compact JSON). An item that did not change keeps its `Arc`, so:
//! * the content hash ([`ConfigItems::hash`]) needs no serialization of unchanged items;
//! * a delta against an older `ConfigItems` ([`ConfigItems::delta_from`]) finds the unchanged
//!   items by pointer, then by digest, never by comparing their contents;
//! * the pusher's base and latest configs share their items with the translate cache instead
//!   of being copies.
//!
//! The full config is serialized from the items ([`ConfigItems::to_json`]) only for a full
//! `Apply`; it decodes to the same [`Config`] as [`ConfigItems::to_config`].

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use std::sync::Arc;
use sweety_config::delta::{self, settings_of, ConfigDelta, Digest, Digests, Named, Section};
use sweety_config::{Backend, Config, Listener, VirtualHost};

/// One item, its digest and the length of its JSON.
#[derive(Debug)]
pub struct Item<T> {
    /// The item, shared with every config that did not change it.
    pub value: Arc<T>,
    /// SHA-256 of the item's compact JSON (the delta protocol's digest).
    pub digest: Digest,
    /// Bytes of that JSON, for the size of a full `Apply` without serializing it.
    pub json_len: usize,
}

impl<T> Clone for Item<T> {
    fn clone(&self) -> Self {
        Item {
            value: self.value.clone(),
            digest: self.digest,
            json_len: self.json_len,
        }
    }
}

impl<T: Serialize> Item<T> {
    /// Digests `value`.
    pub fn new(value: T) -> Self {
        let (digest, json_len) = delta::digest_and_len(&value);
        Item {
            value: Arc::new(value),
            digest,
            json_len,
        }
    }
}

impl<T> Item<T> {
    /// The same item (same allocation) or one with the same content.
    pub fn same(&self, other: &Item<T>) -> bool {
        Arc::ptr_eq(&self.value, &other.value) || self.digest == other.digest
    }
}

/// A config as shared items (see the module docs). `settings` has empty lists and
/// generation 0.
#[derive(Clone, Debug)]
pub struct ConfigItems {
    /// Everything but the three lists: limits, access, generation 0.
    pub settings: Item<Config>,
    /// Listeners, in the order of the config.
    pub listeners: Vec<Item<Listener>>,
    /// Virtual hosts, in the order of the config.
    pub virtual_hosts: Vec<Item<VirtualHost>>,
    /// Backends, in the order of the config.
    pub backends: Vec<Item<Backend>>,
}

impl Default for ConfigItems {
    fn default() -> Self {
        ConfigItems::from_config(Config::default())
    }
}

impl<T: Named> Named for Item<T> {
    fn name(&self) -> &str {
        self.value.name()
    }
}

/// `items` from `list`, reusing the item of `prev` with the same name when its content is
/// equal (same position first, then by name).
fn reuse_items<T: Named + PartialEq + Serialize>(list: Vec<T>, prev: &[Item<T>]) -> Vec<Item<T>> {
    delta::reuse_list(list, prev, |item, i| match i {
        Some(i) if *prev[i].value == item => prev[i].clone(),
        _ => Item::new(item),
    })
}

/// The changes from `base` to `new` (`ConfigDelta::between` semantics): the same item or an
/// equal digest is no change. `None` when either list has a duplicate name.
fn section<T: Named + Clone>(base: &[Item<T>], new: &[Item<T>]) -> Option<Section<T>> {
    delta::section_between(
        base,
        new,
        |i, j| base[i].same(&new[j]),
        |n| (*n.value).clone(),
    )
}

impl ConfigItems {
    /// Items of `config` (every item digested once).
    pub fn from_config(config: Config) -> Self {
        ConfigItems::from_config_reusing(
            config,
            &ConfigItems {
                settings: Item::new(Config::default()),
                listeners: Vec::new(),
                virtual_hosts: Vec::new(),
                backends: Vec::new(),
            },
        )
    }

    /// Items of `config`, reusing (allocation and digest) the items of `prev` that are equal
    /// to the item of the same name: only changed items are serialized.
    pub fn from_config_reusing(mut config: Config, prev: &ConfigItems) -> Self {
        config.generation = 0;
        let listeners = reuse_items(std::mem::take(&mut config.listeners), &prev.listeners);
        let virtual_hosts = reuse_items(
            std::mem::take(&mut config.virtual_hosts),
            &prev.virtual_hosts,
        );
        let backends = reuse_items(std::mem::take(&mut config.backends), &prev.backends);
        let settings = settings_of(&config);
        let settings = if *prev.settings.value == settings {
            prev.settings.clone()
        } else {
            Item::new(settings)
        };
        ConfigItems {
            settings,
            listeners,
            virtual_hosts,
            backends,
        }
    }

    /// The digests, in order.
    pub fn digests(&self) -> Digests {
        Digests {
            settings: self.settings.digest,
            listeners: self.listeners.iter().map(|i| i.digest).collect(),
            virtual_hosts: self.virtual_hosts.iter().map(|i| i.digest).collect(),
            backends: self.backends.iter().map(|i| i.digest).collect(),
        }
    }

    /// The content hash ([`Digests::hash`]).
    pub fn hash(&self) -> String {
        self.digests().hash()
    }

    /// The config, copied out of the items (generation 0).
    pub fn to_config(&self) -> Config {
        let mut c = (*self.settings.value).clone();
        c.generation = 0;
        c.listeners = self.listeners.iter().map(|i| (*i.value).clone()).collect();
        c.virtual_hosts = self
            .virtual_hosts
            .iter()
            .map(|i| (*i.value).clone())
            .collect();
        c.backends = self.backends.iter().map(|i| (*i.value).clone()).collect();
        c
    }

    /// Length of the config's compact JSON (generation 0), from the items' lengths.
    pub fn json_len(&self) -> usize {
        fn list<T>(l: &[Item<T>]) -> usize {
            l.iter().map(|i| i.json_len).sum::<usize>() + l.len().saturating_sub(1)
        }
        // The settings' JSON has the three lists empty (`[]`): the items and commas go in.
        self.settings.json_len
            + list(&self.listeners)
            + list(&self.virtual_hosts)
            + list(&self.backends)
    }

    /// The config as JSON (generation 0), serialized from the items without copying them.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&AsConfig(self)).expect("configs always serialise")
    }

    /// The delta that turns `base` into `self`, whose [`ConfigItems::hash`] is `hash`; `None`
    /// when a list of either has a duplicate name (send the full config).
    pub fn delta_from(&self, base: &ConfigItems, hash: &str) -> Option<ConfigDelta> {
        Some(ConfigDelta {
            settings: (!base.settings.same(&self.settings))
                .then(|| Box::new((*self.settings.value).clone())),
            listeners: section(&base.listeners, &self.listeners)?,
            virtual_hosts: section(&base.virtual_hosts, &self.virtual_hosts)?,
            backends: section(&base.backends, &self.backends)?,
            hash: hash.to_string(),
        })
    }
}

/// Serializes [`ConfigItems`] as the [`Config`] it stands for.
struct AsConfig<'a>(&'a ConfigItems);

struct Seq<'a, T>(&'a [Item<T>]);

impl<T: Serialize> Serialize for Seq<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for i in self.0 {
            seq.serialize_element(&*i.value)?;
        }
        seq.end()
    }
}

impl Serialize for AsConfig<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The settings' own fields (whatever `Config` has besides the lists), then the lists.
        let settings = match serde_json::to_value(&*self.0.settings.value) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(_) => return Err(serde::ser::Error::custom("settings are not an object")),
            Err(e) => return Err(serde::ser::Error::custom(e)),
        };
        let mut map = s.serialize_map(None)?;
        for (k, v) in &settings {
            match k.as_str() {
                "listeners" | "virtual_hosts" | "backends" => {}
                _ => map.serialize_entry(k, v)?,
            }
        }
        map.serialize_entry("listeners", &Seq(&self.0.listeners))?;
        map.serialize_entry("virtual_hosts", &Seq(&self.0.virtual_hosts))?;
        map.serialize_entry("backends", &Seq(&self.0.backends))?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(hosts: &[(&str, &str)]) -> Config {
        let mut y = String::from(
            "listeners: [{name: web, address: 127.0.0.1, port: 0, protocol: http}]\nbackends: [{name: b, endpoints: [{address: 127.0.0.1:1}]}]\nvirtual_hosts:\n",
        );
        for (name, body) in hosts {
            y.push_str(&format!(
                "- {{name: {name}, hostnames: [{name}.test], routes: [{{name: r, action: {{fixed: {{status: 200, body: {body}}}}}}}]}}\n"
            ));
        }
        Config::from_yaml(&y).unwrap()
    }

    #[test]
    fn digests_hash_and_json_are_those_of_the_config() {
        let mut c = config(&[("a", "one"), ("b", "two")]);
        c.generation = 0;
        let items = ConfigItems::from_config(c.clone());
        assert_eq!(items.digests(), Digests::of(&c));
        assert_eq!(items.hash(), Digests::of(&c).hash());
        assert_eq!(items.to_config(), c);
        let back: Config = serde_json::from_slice(&items.to_json()).unwrap();
        assert_eq!(back, c);
        assert_eq!(items.json_len(), serde_json::to_vec(&c).unwrap().len());
    }

    #[test]
    fn unchanged_items_keep_their_allocation_and_deltas_match_config_delta() {
        let old = config(&[("a", "one"), ("b", "two"), ("c", "three")]);
        let old_items = ConfigItems::from_config(old.clone());
        let cases = [
            // A content change in place.
            config(&[("a", "one"), ("b", "TWO"), ("c", "three")]),
            // A removal and an addition (order differs from the default rule).
            config(&[("a", "one"), ("aa", "new"), ("c", "three")]),
            // Appended at the end.
            config(&[("a", "one"), ("b", "two"), ("c", "three"), ("d", "four")]),
            // Nothing.
            old.clone(),
        ];
        for new in cases {
            let items = ConfigItems::from_config_reusing(new.clone(), &old_items);
            for (n, it) in items.virtual_hosts.iter().enumerate() {
                let before = old_items
                    .virtual_hosts
                    .iter()
                    .find(|o| o.value.name == it.value.name);
                if let Some(b) = before.filter(|b| *b.value == *it.value) {
                    assert!(Arc::ptr_eq(&b.value, &it.value), "item {n} reused");
                }
            }
            let ours = items.delta_from(&old_items, &items.hash()).unwrap();
            let theirs = ConfigDelta::between(
                &old_items.to_config(),
                &old_items.digests(),
                &new,
                &Digests::of(&new),
            )
            .unwrap();
            assert_eq!(ours, theirs);
            // And it applies to the base to give the new config.
            let (applied, _) = ours
                .apply(old_items.to_config(), &old_items.digests())
                .unwrap();
            assert_eq!(applied, items.to_config());
        }
    }

    #[test]
    fn duplicate_names_give_no_delta() {
        let base = ConfigItems::from_config(config(&[("a", "one")]));
        let dup = ConfigItems::from_config(config(&[("a", "one"), ("a", "two")]));
        assert!(dup.delta_from(&base, &dup.hash()).is_none());
        assert!(base.delta_from(&dup, &base.hash()).is_none());
    }
}
