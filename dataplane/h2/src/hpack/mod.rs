//! HPACK (RFC 7541): header compression for Sweety's own HTTP/2 connection layer.
//!
//! * [`Decoder`] decodes request header blocks: static and dynamic table, Huffman strings,
//!   dynamic table size updates, and the RFC 9113 §6.5.2 header list size limit. It does not
//!   allocate per field once warm: Huffman strings go to a reused scratch buffer, and the
//!   dynamic table keeps its entries in one byte buffer that is compacted in place.
//! * [`Encoder`] encodes response header blocks without ever inserting into the dynamic
//!   table, so the output depends only on the fields and encoded blocks can be cached and
//!   replayed on any connection. Its only state is whether the connection's first block,
//!   which shrinks the peer's table to zero, has been written (and, per thread, the coded
//!   literals of recent values of fields that repeat, `literal_cache`).
//!
//! Field names and values are passed through as octets: checking them (lowercase names, no
//! CR/LF/NUL, pseudo-header rules) is the HTTP/2 layer's job (RFC 9113 §8.2).

mod decode_memo;
pub mod huffman;
mod literal_cache;

use std::collections::VecDeque;

use bytes::{BufMut, BytesMut};

/// One header field, borrowed for the duration of a [`Decoder::decode`] callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    /// Field name as sent (lowercase is checked by the caller, not here).
    pub name: &'a [u8],
    /// Field value as sent, Huffman-decoded if it was coded.
    pub value: &'a [u8],
    /// Sent as "never indexed" (RFC 7541 §6.2.3): an intermediary must forward it the same way.
    pub sensitive: bool,
}

/// Why a header block could not be decoded.
///
/// Every kind except [`HpackError::ListTooLarge`] is a COMPRESSION_ERROR (RFC 9113 §4.3):
/// the connection must be closed, and the decoder refuses further blocks
/// ([`HpackError::Poisoned`]). See [`HpackError::is_connection_error`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum HpackError {
    /// The block ended inside a field representation or an integer.
    #[error("HPACK: header block ends in the middle of a field representation")]
    Truncated,
    /// A prefixed integer (index, length or size) needs more than 32 bits.
    #[error("HPACK: integer does not fit 32 bits")]
    IntegerOverflow,
    /// An indexed field or name refers to no table entry.
    #[error("HPACK: index {index} is not in the static table or the dynamic table ({dynamic_len} entries)")]
    InvalidIndex {
        /// The index the block used.
        index: usize,
        /// Entries in the dynamic table at that point.
        dynamic_len: usize,
    },
    /// A Huffman-coded string decodes the end-of-string symbol (RFC 7541 §5.2).
    #[error("HPACK: Huffman-coded string contains EOS")]
    HuffmanEos,
    /// A Huffman-coded string is padded with a whole octet or more (RFC 7541 §5.2).
    #[error("HPACK: Huffman-coded string has more than 7 bits of padding")]
    HuffmanPaddingTooLong,
    /// A Huffman-coded string's padding is not the EOS prefix, or the string stops mid-code.
    #[error("HPACK: Huffman-coded string has padding that is not the high bits of EOS (all ones), or ends inside a code")]
    HuffmanPaddingNotOnes,
    /// A dynamic table size update above the limit our SETTINGS allow.
    #[error("HPACK: dynamic table size update to {size} exceeds the advertised limit {max}")]
    SizeUpdateTooLarge {
        /// The size the update asked for.
        size: usize,
        /// Our SETTINGS_HEADER_TABLE_SIZE.
        max: usize,
    },
    /// A size update follows a field in the block (RFC 7541 §4.2 puts it first).
    #[error("HPACK: dynamic table size update after a field representation in the same block")]
    SizeUpdateNotAtStart,
    /// We lowered the table size, and the next block does not acknowledge it with an update.
    #[error("HPACK: header table size was lowered to {max}, but the block does not start with a size update to at most {max}")]
    SizeUpdateMissing {
        /// The lowered SETTINGS_HEADER_TABLE_SIZE.
        max: usize,
    },
    /// The decoded header list exceeds our limit; only this request is refused.
    #[error("header list exceeds {max} octets (RFC 9113 §6.5.2: name + value + 32 per field)")]
    ListTooLarge {
        /// The limit, in RFC 9113 §6.5.2 octets.
        max: usize,
    },
    /// A block was given to a decoder that already failed: its table is out of sync.
    #[error("HPACK: decoder used after a compression error; the connection must be closed")]
    Poisoned,
}

impl HpackError {
    /// True for COMPRESSION_ERROR, which ends the connection. False only for
    /// [`HpackError::ListTooLarge`]: the whole block was still processed, so the dynamic
    /// table is in sync and the connection can go on after refusing the one request (431 or
    /// RST_STREAM).
    pub fn is_connection_error(&self) -> bool {
        !matches!(self, HpackError::ListTooLarge { .. })
    }
}

/// Entry overhead counted in table and header list sizes (RFC 7541 §4.1, RFC 9113 §6.5.2).
const ENTRY_OVERHEAD: usize = 32;

/// SETTINGS_HEADER_TABLE_SIZE's initial value (RFC 9113 §6.5.2).
const DEFAULT_TABLE_SIZE: usize = 4096;

/// The static table (RFC 7541 Appendix A); index `i` is `STATIC[i - 1]`.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The multiplier of the static names' perfect hash ([`name_slot`]), found by search: no
/// two of the table's 52 names share a slot (checked when [`NAME_SLOTS`] is built).
const NAME_HASH: u32 = 0x1e09_b8a3;

/// The slot of a name of `len` octets, first octet `first`, last `last`, in [`NAME_SLOTS`].
const fn name_slot(len: usize, first: u8, last: u8) -> usize {
    let key = (len as u32) | (first as u32) << 8 | (last as u32) << 16;
    (key.wrapping_mul(NAME_HASH) >> 25) as usize
}

/// The octets of `a` and `b` are equal (slices compare only at run time in a `const`).
const fn same_octets(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The first static table index of each name, in its [`name_slot`]; 0 in an empty slot. A
/// table of 128 octets where a `match` over the names was ~2 KiB of code, run for every
/// field encoded (each response field to a client, each request field to an HTTP/2 backend).
const NAME_SLOTS: [u8; 128] = {
    let mut slots = [0u8; 128];
    let mut i = 0;
    while i < STATIC.len() {
        let name = STATIC[i].0;
        let s = name_slot(name.len(), name[0], name[name.len() - 1]);
        if slots[s] == 0 {
            slots[s] = (i + 1) as u8;
        } else {
            // The same name again (`:method`, `:path`, `:scheme`, `:status`): the first kept.
            assert!(
                same_octets(STATIC[slots[s] as usize - 1].0, name),
                "two static table names share a slot: change NAME_HASH"
            );
        }
        i += 1;
    }
    slots
};

/// First static table index with this name: its slot's entry, if that is this name.
fn static_name_index(name: &[u8]) -> Option<usize> {
    let (&first, &last) = (name.first()?, name.last()?);
    let i = NAME_SLOTS[name_slot(name.len(), first, last)] as usize;
    (i != 0 && STATIC[i - 1].0 == name).then_some(i)
}

/// Static table index of the exact field, for the entries that have a value.
fn static_field_index(name_index: usize, value: &[u8]) -> Option<usize> {
    let range = match name_index {
        2 => 2..=3,
        4 => 4..=5,
        6 => 6..=7,
        8 => 8..=14,
        16 => 16..=16,
        _ => return None,
    };
    range.into_iter().find(|&i| STATIC[i - 1].1 == value)
}

/// Reads an integer with an `prefix`-bit prefix (RFC 7541 §5.1) at `*pos`. Values above
/// `u32::MAX` (or more than five continuation octets) are rejected.
fn decode_int(block: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, HpackError> {
    let mask = ((1u16 << prefix) - 1) as u8;
    let first = *block.get(*pos).ok_or(HpackError::Truncated)? & mask;
    *pos += 1;
    if first < mask {
        return Ok(first as usize);
    }
    let mut value = u64::from(mask);
    let mut shift = 0u32;
    loop {
        let b = *block.get(*pos).ok_or(HpackError::Truncated)?;
        *pos += 1;
        value += u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return Err(HpackError::IntegerOverflow);
        }
    }
    if value > u64::from(u32::MAX) {
        return Err(HpackError::IntegerOverflow);
    }
    Ok(value as usize)
}

/// Writes `value` with a `prefix`-bit prefix; `flags` are the representation's high bits.
fn encode_int(dst: &mut BytesMut, value: usize, prefix: u8, flags: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        dst.put_u8(flags | value as u8);
        return;
    }
    dst.put_u8(flags | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        dst.put_u8((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    dst.put_u8(rest as u8);
}

/// Writes a string literal as it is (never Huffman-coded).
fn encode_raw(dst: &mut BytesMut, s: &[u8]) {
    encode_int(dst, s.len(), 7, 0);
    dst.put_slice(s);
}

/// Writes a string literal, Huffman-coded only when that is strictly shorter.
fn encode_str(dst: &mut BytesMut, s: &[u8]) {
    if s.len() <= huffman::SHORT {
        // Nearly every field: one pass that gives up once the coding cannot be shorter.
        if !huffman::encode_short(s, dst) {
            encode_int(dst, s.len(), 7, 0);
            dst.put_slice(s);
        }
        return;
    }
    let huff = huffman::encoded_len(s);
    if huff < s.len() {
        encode_int(dst, huff, 7, 0x80);
        dst.reserve(huff);
        huffman::encode(s, dst);
    } else {
        encode_int(dst, s.len(), 7, 0);
        dst.put_slice(s);
    }
}

/// One dynamic table entry: `name_len + value_len` octets at `start` in the table's buffer.
#[derive(Clone, Copy)]
struct Entry {
    start: usize,
    name_len: usize,
    value_len: usize,
}

/// The dynamic table (RFC 7541 §2.3.2, §4). Entries are appended to `buf` in insertion
/// order; evicting the oldest moves `head` forward, and the live bytes are moved back to
/// the front only when an append would not fit the capacity. The capacity is kept at
/// least twice the table size, so that move happens at most once per `max_size` octets
/// inserted, and it never grows beyond four times the largest size in use.
struct DynTable {
    buf: Vec<u8>,
    head: usize,
    /// Oldest at the front; dynamic index 1 is the back.
    entries: VecDeque<Entry>,
    /// Sum of the entry sizes (name + value + 32).
    size: usize,
    max_size: usize,
}

impl DynTable {
    fn new(max_size: usize) -> Self {
        Self {
            buf: Vec::new(),
            head: 0,
            entries: VecDeque::new(),
            size: 0,
            max_size,
        }
    }

    /// Entry for dynamic index `i` (1 = newest).
    fn entry(&self, i: usize) -> Option<(&[u8], &[u8])> {
        let e = *self.entries.get(self.entries.len().checked_sub(i)?)?;
        let name = &self.buf[e.start..e.start + e.name_len];
        let value = &self.buf[e.start + e.name_len..e.start + e.name_len + e.value_len];
        Some((name, value))
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            let Some(e) = self.entries.pop_front() else {
                break;
            };
            self.size -= e.name_len + e.value_len + ENTRY_OVERHEAD;
        }
        match self.entries.front() {
            Some(e) => self.head = e.start,
            None => {
                self.buf.clear();
                self.head = 0;
            }
        }
    }

    fn set_max_size(&mut self, max: usize) {
        self.max_size = max;
        self.evict_to(max);
    }

    /// Inserts a new entry whose name is `name` or, when `name` is `None`, the name of
    /// dynamic entry `name_dyn` (which may be evicted by this very insertion, §4.4, so it is
    /// copied before evicting).
    fn insert(&mut self, name: Option<&[u8]>, name_dyn: usize, value: &[u8]) {
        let name_len = match name {
            Some(n) => n.len(),
            None => self.entry(name_dyn).map_or(0, |(n, _)| n.len()),
        };
        let size = name_len + value.len() + ENTRY_OVERHEAD;
        if size > self.max_size {
            // §4.4: an entry larger than the table empties it and is not added.
            self.evict_to(0);
            return;
        }
        let need = name_len + value.len();
        if self.buf.len() + need > self.buf.capacity() {
            if self.head > 0 {
                self.buf.drain(..self.head);
                for e in &mut self.entries {
                    e.start -= self.head;
                }
                self.head = 0;
            }
            let want = (2 * self.max_size).max(self.buf.len() + need);
            self.buf.reserve_exact(want - self.buf.len());
        }
        let start = self.buf.len();
        match name {
            Some(n) => self.buf.extend_from_slice(n),
            None => {
                let e = self.entries[self.entries.len() - name_dyn];
                self.buf.extend_from_within(e.start..e.start + e.name_len);
            }
        }
        self.buf.extend_from_slice(value);
        self.entries.push_back(Entry {
            start,
            name_len,
            value_len: value.len(),
        });
        self.size += size;
        self.evict_to(self.max_size);
    }
}

/// Where a decoded string literal lives: in the block itself or in the scratch buffer.
#[derive(Clone, Copy)]
enum Str {
    Block(usize, usize),
    Scratch(usize, usize),
}

impl Str {
    fn get<'a>(self, block: &'a [u8], scratch: &'a [u8]) -> &'a [u8] {
        match self {
            Str::Block(a, b) => &block[a..b],
            Str::Scratch(a, b) => &scratch[a..b],
        }
    }
}

/// Name of a literal field: an index into the tables or a string literal.
#[derive(Clone, Copy)]
enum Name {
    Static(&'static [u8]),
    Dynamic(usize),
    Literal(Str),
}

/// Reads a string literal (RFC 7541 §5.2) at `*pos`; Huffman-coded ones are decoded into
/// `scratch`, through `memo` when it is given (a value of a field whose values repeat).
fn read_str(
    block: &[u8],
    pos: &mut usize,
    scratch: &mut Vec<u8>,
    memo: Option<&mut Option<Box<decode_memo::Memo>>>,
) -> Result<Str, HpackError> {
    let huffman = *block.get(*pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = decode_int(block, pos, 7)?;
    let start = *pos;
    let end = start
        .checked_add(len)
        .filter(|&e| e <= block.len())
        .ok_or(HpackError::Truncated)?;
    *pos = end;
    if !huffman {
        return Ok(Str::Block(start, end));
    }
    let from = scratch.len();
    let coded = &block[start..end];
    match memo {
        Some(memo) if (1..=decode_memo::MAX_CODED).contains(&coded.len()) => {
            let memo = memo.get_or_insert_with(decode_memo::Memo::new);
            if let Some(decoded) = memo.get(coded) {
                scratch.extend_from_slice(decoded);
            } else {
                huffman::decode(coded, scratch)?;
                memo.put(coded, &scratch[from..]);
            }
        }
        _ => huffman::decode(coded, scratch)?,
    }
    Ok(Str::Scratch(from, scratch.len()))
}

/// HPACK decoder for one connection's inbound header blocks.
///
/// State after errors: after [`HpackError::ListTooLarge`] the decoder is fully usable (the
/// block was decoded to its end and the dynamic table updated; only the callback stopped).
/// After any other error the table may be out of sync with the peer, the error is a
/// connection error, and every later `decode` returns [`HpackError::Poisoned`].
pub struct Decoder {
    table: DynTable,
    /// SETTINGS_HEADER_TABLE_SIZE we advertised: the largest size update the peer may send.
    max_allowed: usize,
    /// Set when we lowered `max_allowed` below the table's size: the next block must start
    /// with a size update to at most this value (RFC 7541 §4.2).
    update_required: Option<usize>,
    /// Huffman-decoded name and value of the current field.
    scratch: Vec<u8>,
    /// Huffman-coded values of repeating response fields decoded last (allocated at the
    /// first one).
    memo: Option<Box<decode_memo::Memo>>,
    /// The memo is not used (the fuzz target's reference decoder).
    memo_off: bool,
    /// The block decoded last and its run, for [`Decoder::repeat`] (allocated at the first
    /// block it keeps; `None` on a decoder that does not watch for repeats).
    last: Option<Box<LastBlock>>,
    /// Bumped whenever `last` starts a new run or is forgotten ([`Decoder::run`]).
    run_id: u64,
    poisoned: bool,
}

/// Longest block [`Decoder::repeat`] recognizes (a backend's usual response head is 40 to
/// 150 octets).
pub const MAX_REPEAT_BLOCK: usize = 256;

/// The block a decoder decoded last, when it may be repeated ([`Decoder::repeat`]).
struct LastBlock {
    /// Its octets (at most [`MAX_REPEAT_BLOCK`]); empty: nothing kept.
    octets: Vec<u8>,
    /// Decodes of these octets in a row, each successful: the run (0: nothing kept).
    runs: usize,
    /// Entries one decode of it inserts into the dynamic table.
    inserts: usize,
    /// A field of it is (or is named by) a dynamic table entry.
    refs: bool,
    /// Its header list size (RFC 9113 §6.5.2).
    list_size: usize,
}

/// What one block did, counted by [`Decoder::decode_block`] for [`Decoder::repeat`].
#[derive(Default)]
struct BlockFacts {
    inserts: usize,
    refs: bool,
    size_update: bool,
    list_size: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder with the initial dynamic table size of 4096 octets.
    pub fn new() -> Self {
        Self::with_table_size(DEFAULT_TABLE_SIZE)
    }

    /// A decoder whose table limit is `n` from the start, without a size update (as if both
    /// sides had agreed on it before the first block; the RFC 7541 C.5 and C.6 examples).
    fn with_table_size(n: usize) -> Self {
        Self {
            table: DynTable::new(n),
            max_allowed: n,
            update_required: None,
            scratch: Vec::new(),
            memo: None,
            memo_off: false,
            last: None,
            run_id: 0,
            poisoned: false,
        }
    }

    /// This decoder, watching for a block that repeats the one before it
    /// ([`Decoder::repeat`]): each successful decode of a block of at most
    /// [`MAX_REPEAT_BLOCK`] octets keeps a copy of it (one buffer, reused).
    pub fn watching_repeats(mut self) -> Self {
        self.last = Some(Box::new(LastBlock {
            octets: Vec::new(),
            runs: 0,
            inserts: 0,
            refs: false,
            list_size: 0,
        }));
        self
    }

    /// The run of the block decoded last: it changes whenever a decode's block differs from
    /// the one before (or fails), so fields a caller made of a block of run `r` are the
    /// fields of every block of run `r` (see [`Decoder::repeat`]).
    pub fn run(&self) -> u64 {
        self.run_id
    }

    /// Decodes of the last block's octets in a row (0: no block kept; 1: it differed from
    /// the block before it).
    pub fn repeats(&self) -> usize {
        self.last.as_ref().map_or(0, |l| l.runs)
    }

    /// Whether `block` decodes to the fields of the block decoded last: `Ok(true)` when it is
    /// the octets of that block (kept: a decoder [`Decoder::watching_repeats`]), which
    /// decoded without error within `max_list_size`, and decoding it again gives the same
    /// fields (those of every block of this [`Decoder::run`]). Then the dynamic table is
    /// what decoding it would leave (see below), and the decode is counted as one more of the
    /// run. `Ok(false)`: not known, `decode` it. `Err`: it was decoded (for the table) and
    /// failed as `decode` would have (it cannot: the same octets decoded without error).
    ///
    /// Why it is sound. A block's fields are a function of its octets and of the dynamic
    /// table's entries when it starts; its effect on the table is a function of the same.
    /// Blocks with a size update are never repeated (nor kept), and a decoder that requires
    /// one (`update_required`) repeats nothing, so the table's maximum size is the same
    /// through the whole run. Three cases:
    /// 1. The block inserts nothing: it leaves the table as it found it, and no other block
    ///    was decoded since the last decode of these octets (a decode of other octets
    ///    starts a new run), so the table is the one that decode started with: same fields,
    ///    same table. Nothing is done.
    /// 2. The block refers to no dynamic entry (every name and field is static or literal):
    ///    its fields depend on its octets alone, and so do the `k >= 1` entries `E` it
    ///    inserts. The table after inserting entries one by one, each evicting the oldest
    ///    until the size fits (an entry larger than the maximum empties it, RFC 7541 §4.4),
    ///    is the longest suffix of everything ever inserted whose size fits the maximum
    ///    (by induction over the insertions). After `n` decodes of the run it is the longest
    ///    fitting suffix of `T0 ++ E^n` (`T0`: the table before the run). When it holds
    ///    fewer than `n * k` entries, it is a suffix of `E^n` shorter than `E^n`, so the
    ///    next longer suffix of `E^n` does not fit: it is the longest fitting suffix `S` of
    ///    `E^m` for every `m >= n`. Inserting `E` once more gives the longest fitting suffix
    ///    of `S ++ E`, a suffix of `E^(n+1)` that contains `S`: `S` again. So the table is
    ///    the same sequence of entries whether the block is decoded or not: nothing is done.
    /// 3. As 2 before that steady state (the table still holds entries from before the
    ///    run): the fields are the same, the table is not; the block is decoded for the
    ///    table alone (no field is handed out), which costs a fraction of a decode whose
    ///    fields are validated and built.
    ///
    /// A block that both refers to the table and inserts is not known (`Ok(false)`).
    /// Entries are the same names and values in the same order with the same size; only
    /// where the table keeps their octets may differ, which nothing observes. The memo of
    /// Huffman-coded values is skipped in cases 1 and 2: it only ever gives the decoder's
    /// own answers, so what it holds changes no field.
    pub fn repeat(&mut self, block: &[u8], max_list_size: usize) -> Result<bool, HpackError> {
        if self.poisoned || self.update_required.is_some() {
            return Ok(false);
        }
        let Some(l) = self.last.as_deref_mut() else {
            return Ok(false);
        };
        if l.runs == 0 || l.list_size > max_list_size || l.octets != block {
            return Ok(false);
        }
        if l.inserts == 0
            || (!l.refs && self.table.entries.len() < l.runs.saturating_mul(l.inserts))
        {
            l.runs = l.runs.saturating_add(1);
            return Ok(true);
        }
        if l.refs {
            return Ok(false);
        }
        self.decode(block, max_list_size, |_| {}).map(|()| true)
    }

    /// Keeps what `decode` learnt of `block` for [`Decoder::repeat`] (`facts`: `None` when
    /// it failed).
    fn keep_last(&mut self, block: &[u8], facts: Option<&BlockFacts>) {
        let Some(l) = self.last.as_deref_mut() else {
            return;
        };
        match facts {
            Some(f) if !f.size_update && block.len() <= MAX_REPEAT_BLOCK => {
                if l.runs > 0 && l.octets == block {
                    // The same octets: the same inserts and references (a function of them).
                    l.runs = l.runs.saturating_add(1);
                    l.list_size = f.list_size;
                    return;
                }
                l.octets.clear();
                l.octets.extend_from_slice(block);
                l.runs = 1;
                l.inserts = f.inserts;
                l.refs = f.refs;
                l.list_size = f.list_size;
            }
            _ => {
                l.octets.clear();
                l.runs = 0;
            }
        }
        self.run_id = self.run_id.wrapping_add(1);
    }

    /// This decoder without its memo of repeating values: every Huffman-coded string is
    /// decoded. The fuzz target's reference: both decoders answer every block the same.
    #[doc(hidden)]
    pub fn without_memo(mut self) -> Self {
        self.memo_off = true;
        self
    }

    /// Sets the SETTINGS_HEADER_TABLE_SIZE value we advertised (once the peer acknowledged
    /// it). A size update above it is an error; if it is below the current table size, the
    /// peer's next block must start with a size update to at most `n`.
    pub fn set_max_allowed_table_size(&mut self, n: usize) {
        self.max_allowed = n;
        if n < self.table.max_size {
            self.update_required = Some(self.update_required.map_or(n, |m| m.min(n)));
        }
    }

    /// Current dynamic table size (sum of name + value + 32 over the entries).
    pub fn table_size(&self) -> usize {
        self.table.size
    }

    /// Dynamic table entries, newest (index 62) first.
    pub fn dynamic_entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        (1..=self.table.entries.len()).filter_map(|i| self.table.entry(i))
    }

    /// Decodes one complete header block; calls `f` per field in order, borrowed for the call.
    ///
    /// Fails with [`HpackError::ListTooLarge`] once the RFC 9113 §6.5.2 size (name + value +
    /// 32 per field) passes `max_list_size`; `f` is not called from that field on, but the
    /// rest of the block is still decoded so the dynamic table stays in sync and the decoder
    /// stays usable. Every other error is a connection error (see [`HpackError`]).
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list_size: usize,
        mut f: impl FnMut(Field<'_>),
    ) -> Result<(), HpackError> {
        if self.poisoned {
            return Err(HpackError::Poisoned);
        }
        let mut facts = BlockFacts::default();
        let result = self.decode_block(block, max_list_size, &mut f, &mut facts);
        if let Err(e) = &result {
            if e.is_connection_error() {
                self.poisoned = true;
            }
        }
        if self.last.is_some() {
            self.keep_last(block, result.is_ok().then_some(&facts));
        }
        result
    }

    fn decode_block(
        &mut self,
        block: &[u8],
        max_list_size: usize,
        f: &mut impl FnMut(Field<'_>),
        facts: &mut BlockFacts,
    ) -> Result<(), HpackError> {
        let mut pos = 0;
        let mut list_size = 0usize;
        let mut too_large = false;
        let mut at_start = true;
        if let Some(max) = self.update_required {
            if block.first().is_none_or(|b| b & 0xe0 != 0x20) {
                return Err(HpackError::SizeUpdateMissing { max });
            }
        }
        while pos < block.len() {
            let b = block[pos];
            if b & 0x80 != 0 {
                // §6.1 indexed field.
                let index = decode_int(block, &mut pos, 7)?;
                at_start = false;
                facts.refs |= index > STATIC.len();
                let (name, value) = self.lookup(index)?;
                list_size = list_size.saturating_add(name.len() + value.len() + ENTRY_OVERHEAD);
                too_large |= list_size > max_list_size;
                if !too_large {
                    f(Field {
                        name,
                        value,
                        sensitive: false,
                    });
                }
                continue;
            }
            if b & 0xe0 == 0x20 {
                // §6.3 dynamic table size update.
                if !at_start {
                    return Err(HpackError::SizeUpdateNotAtStart);
                }
                let size = decode_int(block, &mut pos, 5)?;
                if size > self.max_allowed {
                    return Err(HpackError::SizeUpdateTooLarge {
                        size,
                        max: self.max_allowed,
                    });
                }
                if let Some(max) = self.update_required {
                    if size > max {
                        return Err(HpackError::SizeUpdateMissing { max });
                    }
                }
                self.update_required = None;
                self.table.set_max_size(size);
                facts.size_update = true;
                continue;
            }
            at_start = false;
            // §6.2: with incremental indexing (01, 6-bit index), without indexing (0000) or
            // never indexed (0001), both with a 4-bit index.
            let indexing = b & 0x40 != 0;
            let sensitive = !indexing && b & 0x10 != 0;
            let index = decode_int(block, &mut pos, if indexing { 6 } else { 4 })?;
            self.scratch.clear();
            let name = match index {
                0 => Name::Literal(read_str(block, &mut pos, &mut self.scratch, None)?),
                1..=61 => Name::Static(STATIC[index - 1].0),
                _ => {
                    self.lookup(index)?;
                    facts.refs = true;
                    Name::Dynamic(index - STATIC.len())
                }
            };
            // A value of a field whose values repeat and are no secret (`server`, `date`,
            // `content-type`...: named by a static index) is looked up in the memo first.
            let memo = (!sensitive && !self.memo_off && literal_cache::cacheable(index))
                .then_some(&mut self.memo);
            let value = read_str(block, &mut pos, &mut self.scratch, memo)?;
            let value = value.get(block, &self.scratch);
            let name_bytes = match name {
                Name::Static(n) => n,
                Name::Dynamic(i) => self.table.entry(i).map_or(&[][..], |(n, _)| n),
                Name::Literal(s) => s.get(block, &self.scratch),
            };
            list_size = list_size.saturating_add(name_bytes.len() + value.len() + ENTRY_OVERHEAD);
            too_large |= list_size > max_list_size;
            if !too_large {
                f(Field {
                    name: name_bytes,
                    value,
                    sensitive,
                });
            }
            if indexing {
                facts.inserts += 1;
                match name {
                    Name::Dynamic(i) => self.table.insert(None, i, value),
                    Name::Static(n) => self.table.insert(Some(n), 0, value),
                    Name::Literal(s) => {
                        self.table
                            .insert(Some(s.get(block, &self.scratch)), 0, value)
                    }
                }
            }
        }
        if let Some(max) = self.update_required {
            // Only reachable for an empty block (checked at the start otherwise).
            return Err(HpackError::SizeUpdateMissing { max });
        }
        if too_large {
            return Err(HpackError::ListTooLarge { max: max_list_size });
        }
        facts.list_size = list_size;
        Ok(())
    }

    /// Name and value at `index` in the static table followed by the dynamic table.
    fn lookup(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        match index {
            1..=61 => Ok(STATIC[index - 1]),
            _ => index
                .checked_sub(STATIC.len())
                .filter(|&i| i > 0)
                .and_then(|i| self.table.entry(i))
                .ok_or(HpackError::InvalidIndex {
                    index,
                    dynamic_len: self.table.entries.len(),
                }),
        }
    }
}

/// A head built from a block of a decoder's run (see [`Decoder::repeat`]), handed out again,
/// cloned, for a block that repeats it: the response heads of the client and the request
/// heads of the server keep theirs here.
pub struct KeptHead<T> {
    kept: Option<Box<(u64, T)>>,
}

impl<T> Default for KeptHead<T> {
    fn default() -> Self {
        KeptHead { kept: None }
    }
}

impl<T: Clone> KeptHead<T> {
    /// The kept head, cloned, when `block` repeats the run it was built from
    /// ([`Decoder::repeat`]); `Ok(None)`: decode `block`; `Err`: `repeat`'s (the decode's)
    /// error.
    pub fn repeat(
        &self,
        decoder: &mut Decoder,
        block: &[u8],
        max_list_size: usize,
    ) -> Result<Option<T>, HpackError> {
        match self.kept.as_deref() {
            Some((run, head)) if *run == decoder.run() => {
                Ok(decoder.repeat(block, max_list_size)?.then(|| head.clone()))
            }
            _ => Ok(None),
        }
    }

    /// Keeps the head `make` builds of the block just decoded when that block was the same
    /// octets twice in a row (likely again; heads that never repeat cost no copy), unless one
    /// of its run is kept already.
    pub fn keep(&mut self, decoder: &Decoder, make: impl FnOnce() -> T) {
        if decoder.repeats() < 2 {
            return;
        }
        let run = decoder.run();
        if self.kept.as_ref().is_none_or(|k| k.0 != run) {
            self.kept = Some(Box::new((run, make())));
        }
    }
}

/// HPACK encoder for one connection's outbound header blocks. It never adds to the dynamic
/// table (and tells the peer so by shrinking it to zero), so every block it writes is
/// independent of the connection and can be cached.
#[derive(Debug, Default)]
pub struct Encoder {
    size_update_sent: bool,
}

impl Encoder {
    /// An encoder whose first block tells the peer's decoder to shrink its table to zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Start of a header block: emits a dynamic table size update to 0 in the first block
    /// of the connection (once), nothing after.
    pub fn begin_block(&mut self, dst: &mut BytesMut) {
        if !self.size_update_sent {
            self.size_update_sent = true;
            encode_int(dst, 0, 5, 0x20);
        }
    }

    /// `:status`: indexed for 200/204/206/304/400/404/500, a literal without indexing
    /// otherwise.
    pub fn status(dst: &mut BytesMut, status: u16) {
        let index = match status {
            200 => 8,
            204 => 9,
            206 => 10,
            304 => 11,
            400 => 12,
            404 => 13,
            500 => 14,
            _ => 0,
        };
        if index != 0 {
            dst.put_u8(0x80 | index);
            return;
        }
        let mut digits = [0u8; 5];
        let mut n = status;
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        // Literal without indexing, name = static index 8 (:status).
        encode_int(dst, 8, 4, 0);
        encode_str(dst, &digits[i..]);
    }

    /// One field: indexed when the whole field is in the static table (unless sensitive),
    /// otherwise a literal with the static table's name index where there is one. Never
    /// indexed when `sensitive`, without indexing otherwise. Strings are Huffman-coded only
    /// when that is shorter, but for the values of `x-request-id` (`raw_value`): never.
    /// `name` must already be lowercase (RFC 9113 §8.2.1).
    pub fn field(dst: &mut BytesMut, name: &[u8], value: &[u8], sensitive: bool) {
        field_with(dst, name, value, sensitive, Literals::Coded);
    }

    /// [`Encoder::field`] with its string literals never Huffman-coded: the HTTP/2 client's
    /// request fields, which differ per request (addresses, paths, forwarding fields), where
    /// the Huffman pass cost more instructions (about 7,000 per proxied request) than the
    /// octets it saves on a backend link are worth. The same representation rules as
    /// [`Encoder::field`] (one function: `field_with`).
    pub fn field_raw(dst: &mut BytesMut, name: &[u8], value: &[u8], sensitive: bool) {
        field_with(dst, name, value, sensitive, Literals::Raw);
    }
}

/// Whether the values of the field `name` (one the static table lacks) are written as they
/// are by [`Encoder::field`] too: `x-request-id`, a new random id on every response (32 hex
/// digits from the dataplane). Nothing of it repeats for the literal cache, and Huffman-coding
/// it cost ~460 instructions per response (~15 per octet, 1.6 % of a proxied HTTP/2 request)
/// to save 9 of its 32 octets (hex digits code to 5 or 6 bits).
fn raw_value(name: &[u8]) -> bool {
    name == b"x-request-id"
}

/// How a field's string literals are written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Literals {
    /// Huffman-coded when shorter; repeating values (and names the static table lacks)
    /// through the per-thread [`literal_cache`].
    Coded,
    /// As they are.
    Raw,
}

/// [`Encoder::field`] and [`Encoder::field_raw`]: the representation rules (indexed when the
/// whole field is in the static table unless sensitive, else a literal with the static name
/// index where there is one, never indexed when `sensitive`, without indexing otherwise) in
/// one place, the literals written as `literals` says. Inlined into both, each with its
/// constant `literals`, so neither pays for the other's branch.
#[inline(always)]
fn field_with(dst: &mut BytesMut, name: &[u8], value: &[u8], sensitive: bool, literals: Literals) {
    let name_index = static_name_index(name);
    if !sensitive {
        if let Some(i) = name_index.and_then(|n| static_field_index(n, value)) {
            encode_int(dst, i, 7, 0x80);
            return;
        }
    }
    let flags = if sensitive { 0x10 } else { 0x00 };
    match name_index {
        Some(i) => {
            encode_int(dst, i, 4, flags);
            if literals == Literals::Coded && !sensitive && literal_cache::cacheable(i) {
                // A value that repeats (server, date, content-type): coded once per thread.
                literal_cache::encode(dst, value, encode_str);
                return;
            }
        }
        None => {
            dst.put_u8(flags);
            match literals {
                // A name the static table lacks (`x-request-id`, `x-cache`, `x-powered-by`)
                // repeats from response to response like the values above, and a name is no
                // secret (a sensitive field's value is what is never cached).
                Literals::Coded => {
                    literal_cache::encode(dst, name, encode_str);
                    if raw_value(name) {
                        encode_raw(dst, value);
                        return;
                    }
                }
                Literals::Raw => encode_raw(dst, name),
            }
        }
    }
    match literals {
        Literals::Coded => encode_str(dst, value),
        Literals::Raw => encode_raw(dst, value),
    }
}

#[cfg(test)]
mod tests;
