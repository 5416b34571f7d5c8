//! The Huffman-coded response field values a connection's decoder saw last, kept with their
//! decoded octets.
//!
//! A backend codes the same values in every response: nginx sends `server`, `date` and
//! `content-type` as Huffman-coded literals (with incremental indexing, which it never
//! refers to), ~38 coded octets per response, and decoding them cost ~1,800 instructions of
//! a proxied h2c request (issue 23). A hit here is a comparison and a copy. Decoding is a
//! function of the coded octets alone, so a kept answer is the decoder's own answer; only
//! successful decodes are kept. Only values of the response fields
//! [`super::literal_cache::cacheable`] names are kept (no cookie, credential or location:
//! nothing secret stays around), per connection (nothing crosses connections), in
//! [`SLOTS`] slots of at most [`MAX_CODED`] coded octets, allocated at the first such value
//! (a connection that never gets one holds nothing). The server's decoder of client requests
//! has one too: a client that sends a kept name (`cache-control`, `content-type`, `via`)
//! Huffman-coded makes its connection hold the one fixed box (~350 octets), bounded as above.

/// Values kept per connection (the usual response has three such Huffman-coded values).
pub(crate) const SLOTS: usize = 4;

/// Longest coded value kept (a date is 22 coded octets).
pub(crate) const MAX_CODED: usize = 32;

/// The longest decoding of [`MAX_CODED`] octets: the shortest code is 5 bits.
const MAX_DECODED: usize = MAX_CODED * 8 / 5;

#[derive(Clone, Copy)]
struct Slot {
    /// 0: empty (an empty coded string is never looked up).
    coded_len: u8,
    decoded_len: u8,
    coded: [u8; MAX_CODED],
    decoded: [u8; MAX_DECODED],
}

const EMPTY: Slot = Slot {
    coded_len: 0,
    decoded_len: 0,
    coded: [0; MAX_CODED],
    decoded: [0; MAX_DECODED],
};

/// The kept values of one decoder.
pub(crate) struct Memo {
    slots: [Slot; SLOTS],
    /// The slot the next new value replaces (round robin).
    next: usize,
}

impl Memo {
    pub(crate) fn new() -> Box<Memo> {
        Box::new(Memo {
            slots: [EMPTY; SLOTS],
            next: 0,
        })
    }

    /// The decoding kept for `coded` (`1..=MAX_CODED` octets), if any.
    pub(crate) fn get(&self, coded: &[u8]) -> Option<&[u8]> {
        self.slots
            .iter()
            .find(|s| usize::from(s.coded_len) == coded.len() && s.coded[..coded.len()] == *coded)
            .map(|s| &s.decoded[..usize::from(s.decoded_len)])
    }

    /// Keeps `decoded`, the decoding of `coded` (`1..=MAX_CODED` octets).
    pub(crate) fn put(&mut self, coded: &[u8], decoded: &[u8]) {
        if coded.is_empty() || coded.len() > MAX_CODED || decoded.len() > MAX_DECODED {
            return;
        }
        let s = &mut self.slots[self.next];
        self.next = (self.next + 1) % SLOTS;
        s.coded_len = coded.len() as u8;
        s.coded[..coded.len()].copy_from_slice(coded);
        s.decoded_len = decoded.len() as u8;
        s.decoded[..decoded.len()].copy_from_slice(decoded);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_values_are_found_by_their_whole_coding_and_the_oldest_goes() {
        let mut m = Memo::new();
        assert_eq!(m.get(b"ab"), None);
        m.put(b"ab", b"xyz");
        assert_eq!(m.get(b"ab"), Some(&b"xyz"[..]));
        assert_eq!(m.get(b"a"), None, "a prefix is another coding");
        assert_eq!(m.get(b"abc"), None);
        for i in 0..SLOTS as u8 {
            m.put(&[i, i], &[i]);
        }
        assert_eq!(m.get(b"ab"), None, "replaced by the newer ones");
        assert_eq!(m.get(&[1, 1]), Some(&[1u8][..]));
        // Too long to keep.
        let long = [7u8; MAX_CODED + 1];
        m.put(&long, b"v");
        assert_eq!(m.get(&long), None);
    }
}
