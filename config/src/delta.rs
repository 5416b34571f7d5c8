//! Config deltas and the per-item ("tree") content hash: what lets the controller push a
//! one-route change as a small `ApplyDelta` frame instead of a full snapshot (see
//! docs/control-protocol.md).
//!
//! * [`Digests`] are the SHA-256 of each listener, virtual host and backend (their compact
//!   JSON) and of the *settings* (every other field, `generation` left out). The config's
//!   content hash ([`Digests::hash`]) is the SHA-256 of those digests, so a changed item costs
//!   serializing that item, not the whole config. [`Digests::reuse`] takes the digests of
//!   unchanged items (compared with `==`, by name) from the previous config.
//! * A [`ConfigDelta`] holds, per keyed list (listeners, virtual hosts, backends, keyed by
//!   name), the items to insert or replace, the names to remove and, only when the default
//!   does not give it, the new order; the settings when they changed; and the content hash of
//!   the result, which the receiver checks after applying it.
//! * Order rule of a list without `order`: the base order, replaced items in place, removed
//!   ones dropped, new ones appended in `upsert` order. List order is significant (the first
//!   virtual host claiming a hostname wins), so a delta always reproduces it exactly.

use crate::{
    AccessLog, Admin, Backend, CacheSettings, ClientIp, Config, Http3, L4Settings, Limits,
    Listener, Tracing, VirtualHost,
};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use std::collections::{HashMap, HashSet};

/// SHA-256 of one item's compact JSON.
pub type Digest = [u8; 32];

/// Why a delta cannot be applied to a base config.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeltaError {
    /// A removed name is not in the base.
    #[error("{section}: cannot remove {name:?}: not in the base config")]
    UnknownName {
        /// `listeners`, `virtual_hosts` or `backends`.
        section: &'static str,
        /// The name.
        name: String,
    },
    /// A name appears twice among the upserts and removals, or twice in the base.
    #[error("{section}: name {name:?} appears more than once")]
    DuplicateName {
        /// The list.
        section: &'static str,
        /// The name.
        name: String,
    },
    /// `order` is not a permutation of the resulting names.
    #[error("{section}: order does not list every resulting item exactly once")]
    BadOrder {
        /// The list.
        section: &'static str,
    },
    /// `settings` carries listeners, virtual hosts or backends (those travel in their lists).
    #[error("settings must not carry listeners, virtual_hosts or backends")]
    SettingsWithLists,
    /// The result does not hash to what the sender computed.
    #[error("content hash of the result is {got}, the sender expected {expected}")]
    HashMismatch {
        /// Hash of the applied result.
        got: String,
        /// Hash in the delta.
        expected: String,
    },
}

/// Content digests of a config's parts, aligned with its lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    /// Every field that is not one of the lists, `generation` excluded.
    pub settings: Digest,
    /// One per listener, in order.
    pub listeners: Vec<Digest>,
    /// One per virtual host, in order.
    pub virtual_hosts: Vec<Digest>,
    /// One per backend, in order.
    pub backends: Vec<Digest>,
}

/// SHA-256 of one item's compact JSON (what [`Digests`] hold).
pub fn digest_of<T: Serialize>(item: &T) -> Digest {
    digest_and_len(item).0
}

/// [`digest_of`] and the length of the JSON it hashed.
pub fn digest_and_len<T: Serialize>(item: &T) -> (Digest, usize) {
    let mut h = sha2::Sha256::new();
    let mut w = HashWriter(&mut h, 0);
    serde_json::to_writer(&mut w, item).expect("configs always serialise");
    let len = w.1;
    (h.finalize().into(), len)
}

/// Feeds serde_json's output straight into the hasher (no intermediate buffer), counting
/// the bytes.
struct HashWriter<'a>(&'a mut sha2::Sha256, usize);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        self.1 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The settings of a config: every field except the three lists, `generation` 0. Written as
/// an exhaustive destructuring so that a new `Config` field cannot be forgotten here.
pub fn settings_of(c: &Config) -> Config {
    let Config {
        version,
        generation: _,
        listeners: _,
        virtual_hosts: _,
        backends: _,
        limits,
        http3,
        admin,
        access_log,
        client_ip,
        l4,
        cache,
        path_normalization,
        tracing,
        user_sets,
    } = c;
    Config {
        version: *version,
        generation: 0,
        listeners: Vec::new(),
        virtual_hosts: Vec::new(),
        backends: Vec::new(),
        limits: Limits::clone(limits),
        http3: Http3::clone(http3),
        admin: Option::<Admin>::clone(admin),
        access_log: AccessLog::clone(access_log),
        client_ip: ClientIp::clone(client_ip),
        l4: L4Settings::clone(l4),
        cache: CacheSettings::clone(cache),
        path_normalization: *path_normalization,
        tracing: Option::<Tracing>::clone(tracing),
        user_sets: user_sets.clone(),
    }
}

/// Replaces every setting of `c` with those of `settings` (its lists and generation are left
/// alone). Struct update syntax takes every other field from `settings`, so a new `Config`
/// field is carried without being named here.
fn set_settings(c: &mut Config, settings: Config) {
    let generation = c.generation;
    let listeners = std::mem::take(&mut c.listeners);
    let virtual_hosts = std::mem::take(&mut c.virtual_hosts);
    let backends = std::mem::take(&mut c.backends);
    *c = Config {
        generation,
        listeners,
        virtual_hosts,
        backends,
        ..settings
    };
}

/// An item of a keyed list.
pub trait Named {
    /// Its key.
    fn name(&self) -> &str;
}

impl Named for Listener {
    fn name(&self) -> &str {
        &self.name
    }
}
impl Named for VirtualHost {
    fn name(&self) -> &str {
        &self.name
    }
}
impl Named for Backend {
    fn name(&self) -> &str {
        &self.name
    }
}
impl<T: Named + ?Sized> Named for &T {
    fn name(&self) -> &str {
        (**self).name()
    }
}

/// Maps every item of `new` to `keep(item, i)`, where `i` is the position of the item of the
/// same name in `prev` (same position first, then by name; `None`: no such item). What to
/// reuse from `prev[i]` (a digest, a shared item) is up to `keep`.
pub fn reuse_list<N: Named, P: Named, R>(
    new: impl IntoIterator<Item = N>,
    prev: &[P],
    mut keep: impl FnMut(N, Option<usize>) -> R,
) -> Vec<R> {
    let mut by_name: Option<HashMap<&str, usize>> = None;
    new.into_iter()
        .enumerate()
        .map(|(j, item)| {
            let same_pos = prev.get(j).filter(|p| p.name() == item.name()).map(|_| j);
            let i = same_pos.or_else(|| {
                by_name
                    .get_or_insert_with(|| {
                        prev.iter()
                            .enumerate()
                            .map(|(i, p)| (p.name(), i))
                            .collect()
                    })
                    .get(item.name())
                    .copied()
            });
            keep(item, i)
        })
        .collect()
}

/// Digests of `new`, reusing `prev_d[i]` when `new[j] == prev[i]` for the item of the same
/// name.
fn reuse_digests<T: Named + PartialEq + Serialize>(
    new: &[T],
    prev: &[T],
    prev_d: &[Digest],
) -> Vec<Digest> {
    reuse_list(new, prev, |item, i| match i {
        Some(i) if prev[i] == *item && i < prev_d.len() => prev_d[i],
        _ => digest_of(item),
    })
}

impl Digests {
    /// Digests of every part of `config` (serializes all of it once).
    pub fn of(config: &Config) -> Digests {
        Digests {
            settings: digest_of(&settings_of(config)),
            listeners: config.listeners.iter().map(digest_of).collect(),
            virtual_hosts: config.virtual_hosts.iter().map(digest_of).collect(),
            backends: config.backends.iter().map(digest_of).collect(),
        }
    }

    /// Digests of `config`, computing only those of items that differ from the item of the
    /// same name in `prev` (whose digests are `prev_d`).
    pub fn reuse(config: &Config, prev: &Config, prev_d: &Digests) -> Digests {
        let settings = settings_of(config);
        Digests {
            settings: if settings == settings_of(prev) {
                prev_d.settings
            } else {
                digest_of(&settings)
            },
            listeners: reuse_digests(&config.listeners, &prev.listeners, &prev_d.listeners),
            virtual_hosts: reuse_digests(
                &config.virtual_hosts,
                &prev.virtual_hosts,
                &prev_d.virtual_hosts,
            ),
            backends: reuse_digests(&config.backends, &prev.backends, &prev_d.backends),
        }
    }

    /// The config's content hash: hex SHA-256 over `sweety-config-tree-v2`, the settings
    /// digest, then for each list its length and the digest of each chunk of
    /// [`HASH_CHUNK`] item digests, in order (see [`HashCache`] for why chunks).
    pub fn hash(&self) -> String {
        self.hash_with(&chunk_digests(&self.virtual_hosts))
    }

    /// [`Digests::hash`] given the chunk digests of the virtual host list.
    fn hash_with(&self, vhost_chunks: &[Digest]) -> String {
        let mut h = sha2::Sha256::new();
        h.update(b"sweety-config-tree-v2");
        h.update(self.settings);
        let listeners = chunk_digests(&self.listeners);
        let backends = chunk_digests(&self.backends);
        for (len, chunks) in [
            (self.listeners.len(), &listeners[..]),
            (self.virtual_hosts.len(), vhost_chunks),
            (self.backends.len(), &backends[..]),
        ] {
            h.update((len as u64).to_be_bytes());
            for d in chunks {
                h.update(d);
            }
        }
        crate::hex(&h.finalize())
    }
}

/// Item digests per chunk of the tree hash.
pub const HASH_CHUNK: usize = 64;

/// The SHA-256 of each chunk of [`HASH_CHUNK`] digests (the last one may be shorter).
fn chunk_digests(list: &[Digest]) -> Vec<Digest> {
    list.chunks(HASH_CHUNK).map(chunk_digest).collect()
}

fn chunk_digest(chunk: &[Digest]) -> Digest {
    let mut h = sha2::Sha256::new();
    for d in chunk {
        h.update(d);
    }
    h.finalize().into()
}

/// The chunk digests of a config's virtual host list, kept next to a base config by a
/// receiver of deltas ([`ConfigDelta::apply_indexed`]): a delta that replaces or appends a
/// few virtual hosts rehashes their chunks and the short list of chunk digests, not every
/// item digest, so the tree hash costs in proportion to the change (a removal rehashes the
/// chunks after it, whose items moved).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HashCache {
    vhost_chunks: Vec<Digest>,
}

impl HashCache {
    /// The cache for a config with these digests.
    pub fn of(digests: &Digests) -> HashCache {
        HashCache {
            vhost_chunks: chunk_digests(&digests.virtual_hosts),
        }
    }

    /// Brings the cache up to date with `vhosts` after the items at `dirty` positions (and
    /// every position from `from` on) changed.
    fn update(&mut self, vhosts: &[Digest], dirty: &[usize], from: usize) {
        let chunks = vhosts.len().div_ceil(HASH_CHUNK);
        let from = (from / HASH_CHUNK).min(self.vhost_chunks.len()).min(chunks);
        self.vhost_chunks.truncate(from);
        for c in from..chunks {
            let end = ((c + 1) * HASH_CHUNK).min(vhosts.len());
            self.vhost_chunks
                .push(chunk_digest(&vhosts[c * HASH_CHUNK..end]));
        }
        for &p in dirty {
            let c = p / HASH_CHUNK;
            if c < from {
                let end = ((c + 1) * HASH_CHUNK).min(vhosts.len());
                self.vhost_chunks[c] = chunk_digest(&vhosts[c * HASH_CHUNK..end]);
            }
        }
    }
}

/// Changes to one keyed list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section<T> {
    /// Items inserted or replacing the item of the same name.
    #[serde(default = "Vec::new", skip_serializing_if = "Vec::is_empty")]
    pub upsert: Vec<T>,
    /// Names removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
    /// Every resulting name in order, when the default order rule does not give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<String>>,
}

impl<T> Default for Section<T> {
    fn default() -> Self {
        Section {
            upsert: Vec::new(),
            remove: Vec::new(),
            order: None,
        }
    }
}

impl<T> Section<T> {
    /// Nothing changes in this list.
    pub fn is_empty(&self) -> bool {
        self.upsert.is_empty() && self.remove.is_empty() && self.order.is_none()
    }
}

/// The changes that turn a base config into another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigDelta {
    /// New settings (a config whose lists are empty), when they changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<Box<Config>>,
    /// Listener changes.
    #[serde(default, skip_serializing_if = "Section::is_empty")]
    pub listeners: Section<Listener>,
    /// Virtual host changes.
    #[serde(default, skip_serializing_if = "Section::is_empty")]
    pub virtual_hosts: Section<VirtualHost>,
    /// Backend changes.
    #[serde(default, skip_serializing_if = "Section::is_empty")]
    pub backends: Section<Backend>,
    /// [`Digests::hash`] of the result.
    pub hash: String,
}

/// Names strictly increasing (hence unique), else checked with a set.
fn unique_names<T: Named>(list: &[T]) -> bool {
    if list.windows(2).all(|w| w[0].name() < w[1].name()) {
        return true;
    }
    let mut seen = HashSet::with_capacity(list.len());
    list.iter().all(|i| seen.insert(i.name()))
}

/// The changes from `base` to `new`; `None` when a list of either has a duplicate name (not
/// expressible by name: send the full config). `same(i, j)`: `base[i]` and `new[j]` (of the
/// same name) have the same content (equal digests, the same shared item…); `value` gives
/// the item a delta carries for `new[j]`. When both lists hold the same names in the same
/// order (the usual case), only contents are compared, without an index by name.
pub fn section_between<B: Named, N: Named, T>(
    base: &[B],
    new: &[N],
    same: impl Fn(usize, usize) -> bool,
    value: impl Fn(&N) -> T,
) -> Option<Section<T>> {
    let mut out = Section::default();
    // Names first: `same` may hold for items of different names (equal missing digests),
    // and taking those as aligned would drop a rename.
    let aligned =
        base.len() == new.len() && (0..new.len()).all(|i| base[i].name() == new[i].name());
    if aligned {
        if !unique_names(new) {
            return None;
        }
        out.upsert = (0..new.len())
            .filter(|&i| !same(i, i))
            .map(|i| value(&new[i]))
            .collect();
        return Some(out);
    }
    let base_idx: HashMap<&str, usize> = base
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name(), i))
        .collect();
    if base_idx.len() != base.len() {
        return None;
    }
    let mut seen: HashSet<&str> = HashSet::with_capacity(new.len());
    let mut appended = Vec::new();
    for (j, item) in new.iter().enumerate() {
        if !seen.insert(item.name()) {
            return None;
        }
        match base_idx.get(item.name()) {
            Some(&i) if same(i, j) => {}
            Some(_) => out.upsert.push(value(item)),
            None => {
                appended.push(item.name());
                out.upsert.push(value(item));
            }
        }
    }
    out.remove = base
        .iter()
        .filter(|b| !seen.contains(b.name()))
        .map(|b| b.name().to_string())
        .collect();
    // Does the default order rule (base order, removed dropped, new ones appended) give
    // `new`'s order?
    let removed: HashSet<&str> = out.remove.iter().map(String::as_str).collect();
    let kept = base
        .iter()
        .map(Named::name)
        .filter(|n| !removed.contains(n));
    if !kept.chain(appended).eq(new.iter().map(Named::name)) {
        out.order = Some(new.iter().map(|n| n.name().to_string()).collect());
    }
    Some(out)
}

/// Applies one list's changes to `base` (consumed: unchanged items are moved, not copied)
/// with [`edit_list`]; the digests of kept items come from `base_d`, upserted items are
/// hashed.
fn list_apply<T: Named + Serialize>(
    section: &'static str,
    base: Vec<T>,
    base_d: &[Digest],
    changes: Section<T>,
) -> Result<(Vec<T>, Vec<Digest>), DeltaError> {
    let mut items = base;
    let mut digests = base_d.to_vec();
    // Out of step unless `items` is empty: `edit_list` builds it after checking `changes`
    // (so a bad section is reported before a duplicate in the base, as always).
    let mut index = NameIndex::default();
    edit_list(section, &mut items, &mut digests, &mut index, changes)?;
    Ok((items, digests))
}

/// The position of each item of a keyed list by name: kept next to a base config by a
/// receiver of deltas ([`ConfigDelta::apply_indexed`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameIndex(HashMap<String, usize>);

impl NameIndex {
    /// The index of `items`; an error if a name appears twice.
    pub fn of<T: Named>(section: &'static str, items: &[T]) -> Result<NameIndex, DeltaError> {
        let mut map = HashMap::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if map.insert(item.name().to_string(), i).is_some() {
                return Err(DeltaError::DuplicateName {
                    section,
                    name: item.name().to_string(),
                });
            }
        }
        Ok(NameIndex(map))
    }

    /// The position of `name`.
    pub fn get(&self, name: &str) -> Option<usize> {
        self.0.get(name).copied()
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no names.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A change of a keyed list that kept the base order: the items at the base positions
/// `replaced` were replaced in place, then those at the base positions `removed` (ascending,
/// none of them replaced) were dropped, then `appended` new items were added at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPatch {
    /// Base positions of replaced items, in delta order.
    pub replaced: Vec<usize>,
    /// Base positions of removed items, ascending.
    pub removed: Vec<usize>,
    /// Number of items appended.
    pub appended: usize,
}

impl ListPatch {
    /// The positions in the resulting list (of length `len`) of the replaced and appended
    /// items.
    pub fn changed_positions(&self, len: usize) -> Vec<usize> {
        self.replaced
            .iter()
            .map(|&p| p - self.removed.partition_point(|&r| r < p))
            .chain(len.saturating_sub(self.appended)..len)
            .collect()
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.replaced.is_empty() && self.removed.is_empty() && self.appended == 0
    }
}

/// How a keyed list changed when a delta was applied ([`ConfigDelta::apply_indexed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListEdit {
    /// The base order was kept.
    Patch(ListPatch),
    /// Anything else (the delta gave a new order): treat the list as new.
    Full,
}

// Only the tests ask a whole edit these; the dataplane works on the `ListPatch`.
#[cfg(test)]
impl ListEdit {
    /// For a patch, the positions in the resulting list (of length `len`) of the replaced and
    /// appended items; `None` for [`ListEdit::Full`].
    pub fn changed_positions(&self, len: usize) -> Option<Vec<usize>> {
        match self {
            ListEdit::Patch(p) => Some(p.changed_positions(len)),
            ListEdit::Full => None,
        }
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        matches!(self, ListEdit::Patch(p) if p.is_empty())
    }
}

/// Which of the parts other than the virtual hosts a delta changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changed {
    /// The settings (every field outside the three lists).
    pub settings: bool,
    /// The listeners.
    pub listeners: bool,
    /// The backends.
    pub backends: bool,
}

/// What [`ConfigDelta::apply_indexed`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// How the virtual host list changed.
    pub virtual_hosts: ListEdit,
    /// Whether settings, listeners and backends changed.
    pub changed: Changed,
    /// The content hash of the result ([`Digests::hash`], checked against the delta's).
    pub hash: String,
}

/// The one implementation of a section's rules: applies `changes` to `items` in place,
/// keeping `digests` and `index` in step. Without `order` the base order is kept (replaced
/// items in place, removed ones dropped, new ones appended in `upsert` order) in time
/// proportional to the section (plus, for a removal, to the items after the first removed
/// one, which move up), and the edit is a [`ListEdit::Patch`]; with `order` the result is
/// then put in that order and the edit is [`ListEdit::Full`].
///
/// Errors, checked in this order: a name twice among the upserts and removals, a name twice
/// in `items`, a removed name not in `items`, an `order` that is not a permutation of the
/// result. On error `items`, `digests` and `index` may be left half-edited.
fn edit_list<T: Named + Serialize>(
    section: &'static str,
    items: &mut Vec<T>,
    digests: &mut Vec<Digest>,
    index: &mut NameIndex,
    changes: Section<T>,
) -> Result<ListEdit, DeltaError> {
    let Section {
        upsert,
        remove,
        order,
    } = changes;
    let mut touched: HashSet<&str> = HashSet::with_capacity(upsert.len() + remove.len());
    for n in upsert
        .iter()
        .map(Named::name)
        .chain(remove.iter().map(String::as_str))
    {
        if !touched.insert(n) {
            return Err(DeltaError::DuplicateName {
                section,
                name: n.to_string(),
            });
        }
    }
    drop(touched);
    if index.len() != items.len() {
        // Not kept in step by the caller: rebuild rather than corrupt.
        *index = NameIndex::of(section, items)?;
    }
    if digests.len() != items.len() {
        *digests = items.iter().map(digest_of).collect();
    }
    let mut removed = Vec::with_capacity(remove.len());
    for r in &remove {
        match index.get(r) {
            Some(i) => removed.push(i),
            None => {
                return Err(DeltaError::UnknownName {
                    section,
                    name: r.clone(),
                })
            }
        }
    }
    removed.sort_unstable();
    let mut replaced = Vec::new();
    let mut appended = Vec::new();
    for item in upsert {
        match index.get(item.name()) {
            Some(i) => {
                digests[i] = digest_of(&item);
                items[i] = item;
                replaced.push(i);
            }
            None => appended.push(item),
        }
    }
    if let Some(&first) = removed.first() {
        for &i in removed.iter().rev() {
            index.0.remove(items[i].name());
            items.remove(i);
            digests.remove(i);
        }
        for (i, item) in items.iter().enumerate().skip(first) {
            if let Some(pos) = index.0.get_mut(item.name()) {
                *pos = i;
            }
        }
    }
    let added = appended.len();
    for item in appended {
        index.0.insert(item.name().to_string(), items.len());
        digests.push(digest_of(&item));
        items.push(item);
    }
    match order {
        None => Ok(ListEdit::Patch(ListPatch {
            replaced,
            removed,
            appended: added,
        })),
        Some(order) => {
            reorder(section, items, digests, index, &order)?;
            Ok(ListEdit::Full)
        }
    }
}

/// Puts `items` (and their `digests`) in the order the names in `order` give, and updates
/// `index`; [`DeltaError::BadOrder`] unless `order` names every item exactly once.
fn reorder<T: Named>(
    section: &'static str,
    items: &mut Vec<T>,
    digests: &mut Vec<Digest>,
    index: &mut NameIndex,
    order: &[String],
) -> Result<(), DeltaError> {
    let bad = || DeltaError::BadOrder { section };
    if order.len() != items.len() {
        return Err(bad());
    }
    let mut from = Vec::with_capacity(order.len());
    let mut used = vec![false; items.len()];
    for n in order {
        let i = index.get(n).ok_or_else(bad)?;
        if std::mem::replace(&mut used[i], true) {
            return Err(bad());
        }
        from.push(i);
    }
    let mut slots: Vec<Option<T>> = std::mem::take(items).into_iter().map(Some).collect();
    *items = from
        .iter()
        .map(|&i| slots[i].take().expect("each position taken once"))
        .collect();
    *digests = from.iter().map(|&i| digests[i]).collect();
    for (i, n) in order.iter().enumerate() {
        if let Some(pos) = index.0.get_mut(n.as_str()) {
            *pos = i;
        }
    }
    Ok(())
}

/// [`section_between`] of two lists whose items are the same where their digests are.
fn section_by_digest<T: Named + Clone>(
    base: &[T],
    base_d: &[Digest],
    new: &[T],
    new_d: &[Digest],
) -> Option<Section<T>> {
    // A missing digest counts as a change.
    let same =
        |i: usize, j: usize| matches!((base_d.get(i), new_d.get(j)), (Some(a), Some(b)) if a == b);
    section_between(base, new, same, T::clone)
}

impl ConfigDelta {
    /// The names of the virtual hosts this delta replaces or adds: what a patch or a reuse
    /// must not take from the serving table.
    pub fn upserted_vhost_names(&self) -> HashSet<String> {
        self.virtual_hosts
            .upsert
            .iter()
            .map(|v| v.name.clone())
            .collect()
    }

    /// The delta that turns `base` into `new`, from their digests: only items whose digest
    /// changed are carried. `None` when a list has a duplicate name (send the full config).
    pub fn between(base: &Config, base_d: &Digests, new: &Config, new_d: &Digests) -> Option<Self> {
        Some(ConfigDelta {
            settings: (base_d.settings != new_d.settings).then(|| Box::new(settings_of(new))),
            listeners: section_by_digest(
                &base.listeners,
                &base_d.listeners,
                &new.listeners,
                &new_d.listeners,
            )?,
            virtual_hosts: section_by_digest(
                &base.virtual_hosts,
                &base_d.virtual_hosts,
                &new.virtual_hosts,
                &new_d.virtual_hosts,
            )?,
            backends: section_by_digest(
                &base.backends,
                &base_d.backends,
                &new.backends,
                &new_d.backends,
            )?,
            hash: new_d.hash(),
        })
    }

    /// Applies the delta to `base` (consumed) whose digests are `base_d`; the result and its
    /// digests, after checking that the result hashes to [`ConfigDelta::hash`]. Only the
    /// changed items are serialized (for their digests).
    pub fn apply(self, base: Config, base_d: &Digests) -> Result<(Config, Digests), DeltaError> {
        let ConfigDelta {
            settings,
            listeners,
            virtual_hosts,
            backends,
            hash,
        } = self;
        let mut out = base;
        let mut digests = Digests {
            settings: base_d.settings,
            ..Digests::default()
        };
        if let Some(s) = settings {
            if !(s.listeners.is_empty() && s.virtual_hosts.is_empty() && s.backends.is_empty()) {
                return Err(DeltaError::SettingsWithLists);
            }
            digests.settings = digest_of(&*s);
            set_settings(&mut out, *s);
        }
        let (l, ld) = list_apply(
            "listeners",
            std::mem::take(&mut out.listeners),
            &base_d.listeners,
            listeners,
        )?;
        let (v, vd) = list_apply(
            "virtual_hosts",
            std::mem::take(&mut out.virtual_hosts),
            &base_d.virtual_hosts,
            virtual_hosts,
        )?;
        let (b, bd) = list_apply(
            "backends",
            std::mem::take(&mut out.backends),
            &base_d.backends,
            backends,
        )?;
        (out.listeners, out.virtual_hosts, out.backends) = (l, v, b);
        (digests.listeners, digests.virtual_hosts, digests.backends) = (ld, vd, bd);
        let got = digests.hash();
        if got != hash {
            return Err(DeltaError::HashMismatch {
                got,
                expected: hash,
            });
        }
        Ok((out, digests))
    }

    /// [`ConfigDelta::apply`] for a receiver that keeps its base between deltas: `base` is
    /// edited in place and `index` (the position of each virtual host by name, see
    /// [`NameIndex::of`]) is kept in step, so a delta costs in proportion to what it carries,
    /// not to the number of virtual hosts. Listeners and backends (short lists) are applied as
    /// by [`ConfigDelta::apply`]; all three lists follow the same rules ([`edit_list`]).
    /// Returns how the virtual host list changed: a [`ListEdit::Patch`] when only
    /// replacements in place, removals and appends happened, [`ListEdit::Full`] when the
    /// delta reordered the list (then everything after the patch was moved and reindexed).
    ///
    /// The result equals [`ConfigDelta::apply`]'s. On error `base`, `base_d` and `index` are
    /// left half-edited: the caller must drop them (and send for a full config).
    pub fn apply_indexed(
        self,
        base: &mut Config,
        base_d: &mut Digests,
        index: &mut NameIndex,
        cache: &mut HashCache,
    ) -> Result<Applied, DeltaError> {
        let ConfigDelta {
            settings,
            listeners,
            virtual_hosts,
            backends,
            hash,
        } = self;
        let changed = Changed {
            settings: settings.is_some(),
            listeners: !listeners.is_empty(),
            backends: !backends.is_empty(),
        };
        if let Some(s) = settings {
            if !(s.listeners.is_empty() && s.virtual_hosts.is_empty() && s.backends.is_empty()) {
                return Err(DeltaError::SettingsWithLists);
            }
            base_d.settings = digest_of(&*s);
            set_settings(base, *s);
        }
        if changed.listeners {
            let (l, ld) = list_apply(
                "listeners",
                std::mem::take(&mut base.listeners),
                &base_d.listeners,
                listeners,
            )?;
            (base.listeners, base_d.listeners) = (l, ld);
        }
        if changed.backends {
            let (b, bd) = list_apply(
                "backends",
                std::mem::take(&mut base.backends),
                &base_d.backends,
                backends,
            )?;
            (base.backends, base_d.backends) = (b, bd);
        }
        let old_len = base.virtual_hosts.len();
        let virtual_hosts = edit_list(
            "virtual_hosts",
            &mut base.virtual_hosts,
            &mut base_d.virtual_hosts,
            index,
            virtual_hosts,
        )?;
        match &virtual_hosts {
            ListEdit::Patch(ListPatch {
                replaced,
                removed,
                appended,
            }) => {
                // Items move from the first removal on; appended ones start at the old end.
                let from = match (removed.first(), appended) {
                    (Some(&r), _) => r,
                    (None, 0) => usize::MAX,
                    (None, _) => old_len,
                };
                cache.update(&base_d.virtual_hosts, replaced, from);
            }
            ListEdit::Full => *cache = HashCache::of(base_d),
        }
        let got = base_d.hash_with(&cache.vhost_chunks);
        if got != hash {
            return Err(DeltaError::HashMismatch {
                got,
                expected: hash,
            });
        }
        Ok(Applied {
            virtual_hosts,
            changed,
            hash: got,
        })
    }

    /// Number of items carried (upserts and removals), for logs and metrics.
    pub fn items(&self) -> usize {
        self.listeners.upsert.len()
            + self.listeners.remove.len()
            + self.virtual_hosts.upsert.len()
            + self.virtual_hosts.remove.len()
            + self.backends.upsert.len()
            + self.backends.remove.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::full;
    use crate::wire::tests::big_config;
    use std::collections::BTreeSet;

    /// `between` then `apply` gives `new` and the digests computed from scratch.
    fn round_trip(base: &Config, new: &Config) -> ConfigDelta {
        let (bd, nd) = (Digests::of(base), Digests::of(new));
        assert_eq!(Digests::reuse(new, base, &bd), nd, "reused digests");
        let delta = ConfigDelta::between(base, &bd, new, &nd).expect("expressible");
        // Through JSON, as on the wire.
        let json = serde_json::to_vec(&delta).unwrap();
        let back: ConfigDelta = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, delta);
        let (got, gd) = back.apply(base.clone(), &bd).unwrap();
        let mut want = new.clone();
        want.generation = base.generation;
        assert_eq!(got, want);
        assert_eq!(gd, nd);
        assert_eq!(gd.hash(), new.content_hash());
        delta
    }

    #[test]
    fn digest_and_len_hash_and_count_the_compact_json() {
        let c = big_config(3);
        let vh = &c.virtual_hosts[1];
        let json = serde_json::to_vec(vh).unwrap();
        let (d, len) = digest_and_len(vh);
        assert_eq!(len, json.len());
        assert_eq!(d, <[u8; 32]>::from(sha2::Sha256::digest(&json)));
        assert_eq!(digest_of(vh), d);
    }

    #[test]
    fn section_between_aligned_and_indexed_paths_agree() {
        let base = big_config(20);
        let bd = Digests::of(&base);
        let name = |v: &VirtualHost| v.name.clone();
        for edit in 0..20 {
            // Content edits (same names in the same order: the aligned path).
            let mut new = base.clone();
            let edited: BTreeSet<usize> = [edit, (edit * 7 + 3) % 20].into();
            for &k in &edited {
                new.virtual_hosts[k]
                    .hostnames
                    .push(format!("e{edit}.example.com"));
            }
            let nd = Digests::of(&new);
            let aligned = section_between(
                &base.virtual_hosts,
                &new.virtual_hosts,
                |i, j| bd.virtual_hosts[i] == nd.virtual_hosts[j],
                name,
            )
            .unwrap();
            let want: Vec<String> = edited
                .iter()
                .map(|&k| base.virtual_hosts[k].name.clone())
                .collect();
            assert_eq!(aligned.upsert, want, "edit {edit}");
            // The same input with one more item appended (lengths differ: the indexed
            // path) gives the same section plus that item.
            let mut longer = new.clone();
            let mut extra = base.virtual_hosts[0].clone();
            extra.name = "zz-extra".into();
            longer.virtual_hosts.push(extra);
            let ld = Digests::of(&longer);
            let mut indexed = section_between(
                &base.virtual_hosts,
                &longer.virtual_hosts,
                |i, j| bd.virtual_hosts[i] == ld.virtual_hosts[j],
                name,
            )
            .unwrap();
            assert_eq!(
                indexed.upsert.pop().as_deref(),
                Some("zz-extra"),
                "edit {edit}"
            );
            assert_eq!(aligned.upsert, indexed.upsert, "edit {edit}");
            assert_eq!(aligned.remove, indexed.remove, "edit {edit}");
            assert_eq!(aligned.order, indexed.order, "edit {edit}");
            assert!(aligned.remove.is_empty() && aligned.order.is_none());
        }
        // A rename with no digests for either list (`same` holds for every pair in the
        // aligned check): the rename is still carried.
        let mut renamed = base.clone();
        renamed.virtual_hosts[2].name = "renamed".into();
        let s = section_between(
            &base.virtual_hosts,
            &renamed.virtual_hosts,
            |_, _| true,
            name,
        )
        .unwrap();
        assert_eq!(s.upsert, vec!["renamed".to_string()]);
        assert_eq!(s.remove, vec![base.virtual_hosts[2].name.clone()]);
        let s = section_by_digest(&base.virtual_hosts, &[], &renamed.virtual_hosts, &[]).unwrap();
        assert!(s.upsert.iter().any(|v| v.name == "renamed"));
        assert_eq!(s.remove, vec![base.virtual_hosts[2].name.clone()]);
        // A swap (not aligned by name, so the indexed path): both items are unchanged, only
        // the order is carried.
        let mut swapped = base.clone();
        swapped.virtual_hosts.swap(2, 3);
        let sd = Digests::of(&swapped);
        let s = section_between(
            &base.virtual_hosts,
            &swapped.virtual_hosts,
            |i, j| bd.virtual_hosts[i] == sd.virtual_hosts[j],
            |v| v.name.clone(),
        )
        .unwrap();
        assert!(s.upsert.is_empty() && s.remove.is_empty());
        assert_eq!(s.order.as_ref().map(Vec::len), Some(20));
        // A duplicate name in an aligned list: not expressible.
        let mut dup = base.clone();
        dup.virtual_hosts[4].name = dup.virtual_hosts[3].name.clone();
        let dd = Digests::of(&dup);
        assert!(section_between(
            &dup.virtual_hosts,
            &dup.virtual_hosts,
            |i, j| dd.virtual_hosts[i] == dd.virtual_hosts[j],
            |v| v.name.clone(),
        )
        .is_none());
    }

    #[test]
    fn reuse_list_matches_by_position_then_by_name() {
        let base = big_config(5);
        let mut new: Vec<VirtualHost> = base.virtual_hosts.clone();
        new.rotate_left(1);
        let got = reuse_list(&new, &base.virtual_hosts, |_, i| i);
        assert_eq!(got, vec![Some(1), Some(2), Some(3), Some(4), Some(0)]);
        let mut extra = new[0].clone();
        extra.name = "not-there".into();
        assert_eq!(
            reuse_list([&extra], &base.virtual_hosts, |_, i| i),
            vec![None]
        );
    }

    #[test]
    fn unchanged_config_is_an_empty_delta() {
        let c = big_config(50);
        let d = round_trip(&c, &c);
        assert_eq!(d.items(), 0);
        assert!(d.settings.is_none());
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            format!("{{\"hash\":\"{}\"}}", c.content_hash())
        );
    }

    #[test]
    fn one_changed_item_is_the_only_one_carried() {
        let base = big_config(200);
        let mut new = base.clone();
        new.virtual_hosts[17]
            .hostnames
            .push("more.example.com".into());
        let d = round_trip(&base, &new);
        assert_eq!(d.items(), 1);
        assert_eq!(d.virtual_hosts.upsert[0].name, base.virtual_hosts[17].name);
        assert!(d.virtual_hosts.order.is_none());
    }

    #[test]
    fn inserts_removals_reorders_and_settings() {
        let base = big_config(30);
        // Removal in the middle and an append keep the default order.
        let mut new = base.clone();
        new.virtual_hosts.remove(3);
        let mut extra = new.virtual_hosts[0].clone();
        extra.name = "extra".into();
        new.virtual_hosts.push(extra.clone());
        let d = round_trip(&base, &new);
        assert_eq!(
            (d.virtual_hosts.upsert.len(), d.virtual_hosts.remove.len()),
            (1, 1)
        );
        assert!(d.virtual_hosts.order.is_none());
        // An insert at the front needs the order.
        let mut new = base.clone();
        new.virtual_hosts.insert(0, extra);
        let d = round_trip(&base, &new);
        assert_eq!(d.virtual_hosts.upsert.len(), 1);
        assert_eq!(d.virtual_hosts.order.as_ref().map(Vec::len), Some(31));
        // A pure reorder carries no items, only the order.
        let mut new = base.clone();
        new.virtual_hosts.swap(1, 2);
        let d = round_trip(&base, &new);
        assert_eq!(d.items(), 0);
        assert!(d.virtual_hosts.order.is_some());
        // Settings, listeners and backends.
        let base = full();
        let mut new = base.clone();
        new.limits.max_connections += 1;
        new.listeners[0].port += 1;
        new.backends.remove(0);
        let d = round_trip(&base, &new);
        assert!(d.settings.is_some());
        assert_eq!(d.listeners.upsert.len(), 1);
        assert_eq!(d.backends.remove.len(), 1);
        // Everything removed, then everything back.
        let empty = Config::default();
        round_trip(&base, &empty);
        round_trip(&empty, &base);
    }

    #[test]
    fn random_edit_sequences_round_trip() {
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut below = |n: usize| {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            (rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
        };
        let mut base = big_config(40);
        // Edits made, by kind: remove, insert, swap, replace, settings.
        let mut made = [0usize; 5];
        for step in 0..200 {
            let mut new = base.clone();
            for k in 0..=below(3) {
                let n = new.virtual_hosts.len();
                match below(5) {
                    0 if n > 0 => {
                        new.virtual_hosts.remove(below(n));
                        made[0] += 1;
                    }
                    1 => {
                        let mut v = base.virtual_hosts[below(base.virtual_hosts.len())].clone();
                        v.name = format!("new-{step}-{k}");
                        new.virtual_hosts.insert(below(n + 1), v);
                        made[1] += 1;
                    }
                    2 if n > 1 => {
                        let (i, j) = (below(n), below(n));
                        new.virtual_hosts.swap(i, j);
                        made[2] += usize::from(i != j);
                    }
                    3 if n > 0 => {
                        new.virtual_hosts[below(n)].hostnames = vec![format!("h{step}.test")];
                        made[3] += 1;
                    }
                    _ => {
                        let max = below(1000) as u32 + 1;
                        made[4] += usize::from(new.limits.max_connections != max);
                        new.limits.max_connections = max;
                    }
                }
            }
            round_trip(&base, &new);
            base = new;
        }
        assert!(
            made.iter().all(|&m| m > 0),
            "every edit kind made: {made:?}"
        );
    }

    /// Rebuilds the list an edit describes from the base list and the delta's upserts.
    fn replay(base: &[VirtualHost], result: &[VirtualHost], edit: &ListEdit) -> Vec<String> {
        let ListEdit::Patch(ListPatch {
            replaced,
            removed,
            appended,
        }) = edit
        else {
            return result.iter().map(|v| v.name.clone()).collect();
        };
        let mut names: Vec<Option<String>> = base.iter().map(|v| Some(v.name.clone())).collect();
        for &i in replaced {
            assert!(names[i].is_some());
        }
        for &i in removed {
            names[i] = None;
        }
        let mut out: Vec<String> = names.into_iter().flatten().collect();
        let n = result.len();
        out.extend(result[n - appended..].iter().map(|v| v.name.clone()));
        out
    }

    #[test]
    fn apply_indexed_matches_apply_and_describes_the_edit() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut below = |n: usize| {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            (rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
        };
        // More than two hash chunks.
        let mut base = big_config(150);
        let mut kept = base.clone();
        let mut kept_d = Digests::of(&kept);
        let mut index = NameIndex::of("virtual_hosts", &kept.virtual_hosts).unwrap();
        let mut cache = HashCache::of(&kept_d);
        let mut patches = 0;
        // Edits made, by kind: remove, insert, append, swap, replace, listener, settings.
        let mut made = [0usize; 7];
        // What the deltas carried: removals, appends, replacements, a new order.
        let mut carried = [0usize; 4];
        for step in 0..300 {
            let mut new = base.clone();
            for k in 0..=below(3) {
                let n = new.virtual_hosts.len();
                match below(7) {
                    0 if n > 0 => {
                        new.virtual_hosts.remove(below(n));
                        made[0] += 1;
                    }
                    1 => {
                        let mut v = base.virtual_hosts[below(base.virtual_hosts.len())].clone();
                        v.name = format!("new-{step}-{k}");
                        new.virtual_hosts.insert(below(n + 1), v);
                        made[1] += 1;
                    }
                    2 => {
                        let mut v = base.virtual_hosts[below(base.virtual_hosts.len())].clone();
                        v.name = format!("end-{step}-{k}");
                        new.virtual_hosts.push(v);
                        made[2] += 1;
                    }
                    3 if n > 1 && below(4) == 0 => {
                        let (i, j) = (below(n), below(n));
                        new.virtual_hosts.swap(i, j);
                        made[3] += usize::from(i != j);
                    }
                    4 if n > 0 => {
                        new.virtual_hosts[below(n)].hostnames = vec![format!("h{step}.test")];
                        made[4] += 1;
                    }
                    5 => {
                        let port = below(1000) as u16 + 1;
                        made[5] += usize::from(new.listeners[0].port != port);
                        new.listeners[0].port = port;
                    }
                    _ => {
                        let max = below(1000) as u32 + 1;
                        made[6] += usize::from(new.limits.max_connections != max);
                        new.limits.max_connections = max;
                    }
                }
            }
            let (bd, nd) = (Digests::of(&base), Digests::of(&new));
            let delta = ConfigDelta::between(&base, &bd, &new, &nd).unwrap();
            let before = kept.virtual_hosts.clone();
            let (want, want_d) = delta.clone().apply(base.clone(), &bd).unwrap();
            let applied = delta
                .clone()
                .apply_indexed(&mut kept, &mut kept_d, &mut index, &mut cache)
                .unwrap();
            assert_eq!(kept, want, "step {step}");
            assert_eq!(kept_d, want_d, "step {step}");
            assert_eq!(
                index,
                NameIndex::of("virtual_hosts", &want.virtual_hosts).unwrap()
            );
            let names: Vec<String> = want.virtual_hosts.iter().map(|v| v.name.clone()).collect();
            assert_eq!(
                replay(&before, &want.virtual_hosts, &applied.virtual_hosts),
                names
            );
            assert_eq!(applied.hash, want_d.hash());
            assert_eq!(cache, HashCache::of(&want_d), "step {step}");
            if let Some(positions) = applied.virtual_hosts.changed_positions(names.len()) {
                let mut got: Vec<&str> = positions.iter().map(|&i| names[i].as_str()).collect();
                let mut sent: Vec<&str> = delta
                    .virtual_hosts
                    .upsert
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect();
                got.sort_unstable();
                sent.sort_unstable();
                assert_eq!(got, sent, "step {step}");
            }
            if let ListEdit::Patch(p) = &applied.virtual_hosts {
                patches += 1;
                carried[0] += usize::from(!p.removed.is_empty());
                carried[1] += usize::from(p.appended > 0);
                carried[2] += usize::from(!p.replaced.is_empty());
                assert_eq!(
                    p.replaced.len(),
                    delta.virtual_hosts.upsert.len() - p.appended
                );
            } else {
                assert!(delta.virtual_hosts.order.is_some());
                carried[3] += 1;
            }
            assert_eq!(applied.changed.settings, delta.settings.is_some());
            assert_eq!(applied.changed.listeners, !delta.listeners.is_empty());
            base = new;
        }
        assert!(patches > 100, "mostly patches: {patches}");
        assert!(
            made.iter().all(|&m| m > 0),
            "every edit kind made: {made:?}"
        );
        assert!(
            carried.iter().all(|&c| c > 0),
            "patches with removals, appends and replacements, and reorders: {carried:?}"
        );
    }

    #[test]
    fn apply_indexed_rejects_bad_deltas() {
        let base = big_config(5);
        let bd = Digests::of(&base);
        let good = ConfigDelta::between(&base, &bd, &base, &bd).unwrap();
        let fresh = || {
            let index = NameIndex::of("virtual_hosts", &base.virtual_hosts).unwrap();
            (base.clone(), bd.clone(), index)
        };
        let mut d = good.clone();
        d.virtual_hosts.remove.push("nope".into());
        let (mut c, mut cd, mut i) = fresh();
        assert_eq!(
            d.apply_indexed(&mut c, &mut cd, &mut i, &mut HashCache::of(&bd))
                .unwrap_err(),
            DeltaError::UnknownName {
                section: "virtual_hosts",
                name: "nope".into()
            }
        );
        let mut d = good.clone();
        d.virtual_hosts.upsert.push(base.virtual_hosts[1].clone());
        d.virtual_hosts
            .remove
            .push(base.virtual_hosts[1].name.clone());
        let (mut c, mut cd, mut i) = fresh();
        assert!(matches!(
            d.apply_indexed(&mut c, &mut cd, &mut i, &mut HashCache::of(&bd))
                .unwrap_err(),
            DeltaError::DuplicateName { .. }
        ));
        let mut d = good.clone();
        d.virtual_hosts.upsert.push(base.virtual_hosts[0].clone());
        d.virtual_hosts.upsert.push(base.virtual_hosts[0].clone());
        let (mut c, mut cd, mut i) = fresh();
        assert!(matches!(
            d.apply_indexed(&mut c, &mut cd, &mut i, &mut HashCache::of(&bd))
                .unwrap_err(),
            DeltaError::DuplicateName { .. }
        ));
        let mut d = good.clone();
        d.settings = Some(Box::new(base.clone()));
        let (mut c, mut cd, mut i) = fresh();
        assert_eq!(
            d.apply_indexed(&mut c, &mut cd, &mut i, &mut HashCache::of(&bd))
                .unwrap_err(),
            DeltaError::SettingsWithLists
        );
        // An upsert that is not what the sender hashed.
        let mut d = good.clone();
        let mut v = base.virtual_hosts[2].clone();
        v.hostnames = vec!["other.test".into()];
        d.virtual_hosts.upsert.push(v);
        let (mut c, mut cd, mut i) = fresh();
        let err = d
            .apply_indexed(&mut c, &mut cd, &mut i, &mut HashCache::of(&bd))
            .unwrap_err();
        assert!(matches!(err, DeltaError::HashMismatch { .. }), "{err}");
        // A good empty delta is an empty patch.
        let (mut c, mut cd, mut i) = fresh();
        let applied = good
            .apply_indexed(&mut c, &mut cd, &mut i, &mut HashCache::of(&bd))
            .unwrap();
        assert!(applied.virtual_hosts.is_empty());
        assert_eq!(applied.changed, Changed::default());
        assert_eq!(c, base);
    }

    /// `apply` and `apply_indexed` share one implementation of the section rules: the same
    /// bad delta is the same error on both, checked in the documented order.
    #[test]
    fn both_apply_paths_report_the_same_error() {
        let base = big_config(6);
        let bd = Digests::of(&base);
        let good = ConfigDelta::between(&base, &bd, &base, &bd).unwrap();
        let names: Vec<String> = base.virtual_hosts.iter().map(|v| v.name.clone()).collect();
        let mut dup_base = base.clone();
        dup_base.virtual_hosts[1].name = names[0].clone();
        let vh = |i: usize| base.virtual_hosts[i].clone();
        type Edit<'a> = Box<dyn Fn(&mut ConfigDelta) + 'a>;
        let cases: Vec<(&str, Config, Edit<'_>, DeltaError)> = vec![
            (
                "upsert and remove of one name",
                base.clone(),
                Box::new(|d| {
                    d.virtual_hosts.upsert.push(vh(1));
                    d.virtual_hosts.remove.push(names[1].clone());
                }),
                DeltaError::DuplicateName {
                    section: "virtual_hosts",
                    name: names[1].clone(),
                },
            ),
            (
                "a bad section is reported before a duplicate in the base",
                dup_base.clone(),
                Box::new(|d| {
                    d.virtual_hosts.remove.push(names[2].clone());
                    d.virtual_hosts.remove.push(names[2].clone());
                }),
                DeltaError::DuplicateName {
                    section: "virtual_hosts",
                    name: names[2].clone(),
                },
            ),
            (
                "a duplicate in the base",
                dup_base,
                Box::new(|d| d.virtual_hosts.remove.push(names[2].clone())),
                DeltaError::DuplicateName {
                    section: "virtual_hosts",
                    name: names[0].clone(),
                },
            ),
            (
                "unknown removal",
                base.clone(),
                Box::new(|d| d.virtual_hosts.remove.push("nope".into())),
                DeltaError::UnknownName {
                    section: "virtual_hosts",
                    name: "nope".into(),
                },
            ),
            (
                "order names one item twice",
                base.clone(),
                Box::new(|d| {
                    let mut order = names.clone();
                    order[3] = names[4].clone();
                    d.virtual_hosts.order = Some(order);
                }),
                DeltaError::BadOrder {
                    section: "virtual_hosts",
                },
            ),
            (
                "order names an unknown item",
                base.clone(),
                Box::new(|d| {
                    let mut order = names.clone();
                    order[3] = "nope".into();
                    d.virtual_hosts.order = Some(order);
                }),
                DeltaError::BadOrder {
                    section: "virtual_hosts",
                },
            ),
            (
                "order too short",
                base.clone(),
                Box::new(|d| d.virtual_hosts.order = Some(names[1..].to_vec())),
                DeltaError::BadOrder {
                    section: "virtual_hosts",
                },
            ),
            (
                "listeners follow the same rules",
                base.clone(),
                Box::new(|d| d.listeners.remove.push("nope".into())),
                DeltaError::UnknownName {
                    section: "listeners",
                    name: "nope".into(),
                },
            ),
        ];
        for (what, base, edit, want) in cases {
            let mut d = good.clone();
            edit(&mut d);
            let bd = Digests::of(&base);
            assert_eq!(
                d.clone().apply(base.clone(), &bd).unwrap_err(),
                want,
                "{what}"
            );
            let (mut c, mut cd) = (base.clone(), bd.clone());
            // An index out of step (as for a base with a duplicate) is rebuilt first.
            let mut index = NameIndex::of("virtual_hosts", &base.virtual_hosts).unwrap_or_default();
            let got = d
                .apply_indexed(&mut c, &mut cd, &mut index, &mut HashCache::of(&bd))
                .unwrap_err();
            assert_eq!(got, want, "{what} (indexed)");
        }
    }

    #[test]
    fn bad_deltas_are_errors() {
        let base = big_config(5);
        let bd = Digests::of(&base);
        let new = base.clone();
        let good = ConfigDelta::between(&base, &bd, &new, &Digests::of(&new)).unwrap();

        let mut d = good.clone();
        d.virtual_hosts.remove.push("nope".into());
        assert_eq!(
            d.apply(base.clone(), &bd).unwrap_err(),
            DeltaError::UnknownName {
                section: "virtual_hosts",
                name: "nope".into()
            }
        );
        let mut d = good.clone();
        d.virtual_hosts.upsert.push(base.virtual_hosts[1].clone());
        d.virtual_hosts
            .remove
            .push(base.virtual_hosts[1].name.clone());
        assert!(matches!(
            d.apply(base.clone(), &bd).unwrap_err(),
            DeltaError::DuplicateName { .. }
        ));
        let mut d = good.clone();
        d.virtual_hosts.order = Some(vec!["x".into(); 5]);
        assert_eq!(
            d.apply(base.clone(), &bd).unwrap_err(),
            DeltaError::BadOrder {
                section: "virtual_hosts"
            }
        );
        let mut d = good.clone();
        d.settings = Some(Box::new(base.clone()));
        assert_eq!(
            d.apply(base.clone(), &bd).unwrap_err(),
            DeltaError::SettingsWithLists
        );
        // A delta computed against another base applies but does not hash as announced.
        let mut other = base.clone();
        other.virtual_hosts[0].hostnames = vec!["other.test".into()];
        let d = good.clone();
        let err = d.apply(other.clone(), &Digests::of(&other)).unwrap_err();
        assert!(matches!(err, DeltaError::HashMismatch { .. }), "{err}");
        // Duplicate names cannot be expressed: the caller sends the full config.
        let mut dup = base.clone();
        dup.virtual_hosts[1].name = dup.virtual_hosts[0].name.clone();
        assert!(ConfigDelta::between(&base, &bd, &dup, &Digests::of(&dup)).is_none());
    }
}
