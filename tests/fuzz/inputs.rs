//! Bytes for the decoder, from a seed: random bytes, mutations of valid
//! payloads, and MessagePack streams built to be almost right (wrong counts
//! and lengths, nesting bombs, huge counts, every marker and ext type).

/// splitmix64: every seed its own stream.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut rng = Rng(seed);
        rng.next();
        rng
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.index(xs.len())]
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Markers worth planting: containers, lengths, nil, the unused 0xc1, ext.
const MARKERS: &[u8] = &[
    0x00, 0x01, 0x7f, 0x80, 0x81, 0x8f, 0x90, 0x91, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4,
    0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xcb, 0xcc, 0xcf, 0xd0, 0xd3, 0xd4, 0xd6, 0xd8, 0xd9, 0xdb,
    0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff,
];

/// Counts and lengths worth writing into a length field.
const COUNTS: &[u64] = &[
    0,
    1,
    2,
    15,
    16,
    100,
    101,
    255,
    256,
    4095,
    4096,
    4097,
    65535,
    65536,
    0x7fff_ffff,
    0xffff_ffff,
];

/// `payload` (valid, as the encoder writes them) with the entries of every
/// map in the order of their bytes. The encoder writes a table's entries
/// in LuaJIT's `next` order, which changes from process to process (string
/// hash seeds, addresses of table keys), and a seed's input must be the
/// same bytes in every process, so that it can be replayed.
pub fn canonical(payload: &[u8]) -> Vec<u8> {
    let mut at = 0;
    let mut out = Vec::with_capacity(payload.len());
    // the count, the map header, and (position, value) pairs in order
    while at < payload.len() {
        out.extend(canonical_value(payload, &mut at));
    }
    out
}

/// The value at `*at`, canonical; moves `*at` past it.
fn canonical_value(b: &[u8], at: &mut usize) -> Vec<u8> {
    let m = b[*at];
    let be = |from: usize, width: usize| {
        b[from..from + width]
            .iter()
            .fold(0usize, |n, &x| n << 8 | x as usize)
    };
    // (header bytes, then: bytes of data, or items of an array, or entries of a map)
    let (head, data, items, entries) = match m {
        0x80..=0x8f => (1, 0, 0, (m & 0x0f) as usize),
        0x90..=0x9f => (1, 0, (m & 0x0f) as usize, 0),
        0xa0..=0xbf => (1, (m & 0x1f) as usize, 0, 0),
        0xc4 | 0xd9 => (2, be(*at + 1, 1), 0, 0),
        0xc5 | 0xda => (3, be(*at + 1, 2), 0, 0),
        0xc6 | 0xdb => (5, be(*at + 1, 4), 0, 0),
        0xca => (1, 4, 0, 0),
        0xcb => (1, 8, 0, 0),
        0xcc | 0xd0 => (1, 1, 0, 0),
        0xcd | 0xd1 => (1, 2, 0, 0),
        0xce | 0xd2 => (1, 4, 0, 0),
        0xcf | 0xd3 => (1, 8, 0, 0),
        0xd6 => (1, 5, 0, 0),
        0xdc => (3, 0, be(*at + 1, 2), 0),
        0xdd => (5, 0, be(*at + 1, 4), 0),
        0xde => (3, 0, 0, be(*at + 1, 2)),
        0xdf => (5, 0, 0, be(*at + 1, 4)),
        _ => (1, 0, 0, 0),
    };
    let mut out = b[*at..*at + head + data].to_vec();
    *at += head + data;
    for _ in 0..items {
        out.extend(canonical_value(b, at));
    }
    let mut pairs: Vec<Vec<u8>> = (0..entries)
        .map(|_| {
            let mut pair = canonical_value(b, at);
            pair.extend(canonical_value(b, at));
            pair
        })
        .collect();
    pairs.sort();
    out.extend(pairs.concat());
    out
}

/// Random bytes, half of them behind a header that says "one value".
pub fn random(rng: &mut Rng) -> Vec<u8> {
    let len = if rng.chance(90) {
        rng.index(48)
    } else {
        rng.index(1024)
    };
    let mut b = rng.bytes(len);
    if len >= 3 && rng.chance(50) {
        b[..3].copy_from_slice(&[0x01, 0x81, 0x01]);
    }
    b
}

/// `base` (a valid payload) changed one to four times.
pub fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..=rng.below(4) {
        if b.is_empty() {
            b.push(rng.next() as u8);
            continue;
        }
        let i = rng.index(b.len());
        match rng.below(9) {
            0 => b[i] ^= 1 << rng.below(8),
            1 => b[i] = rng.next() as u8,
            2 => b[i] = rng.pick(MARKERS),
            3 => b.truncate(i),
            4 => {
                let n = 1 + rng.index(8);
                let bytes = rng.bytes(n);
                b.splice(i..i, bytes);
            }
            5 => {
                let end = (i + 1 + rng.index(16)).min(b.len());
                b.drain(i..end);
            }
            6 => {
                let end = (i + 1 + rng.index(32)).min(b.len());
                let copy = b[i..end].to_vec();
                let at = rng.index(b.len() + 1);
                b.splice(at..at, copy);
            }
            7 => change_length(rng, &mut b),
            _ => {
                // the head of one place and the tail of another
                let j = rng.index(base.len());
                b.truncate(i);
                b.extend_from_slice(&base[j..]);
            }
        }
    }
    b
}

/// Rewrites the count or length of a container, string or ext in `b`.
fn change_length(rng: &mut Rng, b: &mut [u8]) {
    let starts: Vec<usize> = (0..b.len())
        .filter(|&i| matches!(b[i], 0x80..=0xbf | 0xc4..=0xc9 | 0xd9..=0xdf))
        .collect();
    if starts.is_empty() {
        return;
    }
    let i = rng.pick(&starts);
    let count = rng.pick(COUNTS);
    match b[i] {
        0x80..=0x9f => b[i] = (b[i] & 0xf0) | (count as u8 & 0x0f),
        0xa0..=0xbf => b[i] = 0xa0 | (count as u8 & 0x1f),
        m => {
            let width = match m {
                0xc4 | 0xc7 | 0xd9 => 1,
                0xc5 | 0xc8 | 0xda | 0xdc | 0xde => 2,
                _ => 4,
            };
            let be = count.to_be_bytes();
            for k in 0..width {
                if let Some(x) = b.get_mut(i + 1 + k) {
                    *x = be[8 - width + k];
                }
            }
        }
    }
}

/// About how many values a structured payload holds at most.
const VALUES: usize = 40;

/// A MessagePack stream that is a payload in shape, with anything inside.
pub fn structured(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    let n = if rng.chance(80) {
        rng.below(8)
    } else {
        rng.pick(COUNTS)
    };
    if rng.chance(95) {
        write_uint(&mut out, n);
    } else {
        value(rng, &mut out, 0, &mut 1);
    }
    let k = if rng.chance(85) {
        n.min(rng.below(6))
    } else {
        rng.pick(COUNTS)
    };
    match rng.below(10) {
        0 => header(&mut out, 0x90, 0xdc, k),
        _ => header(&mut out, 0x80, 0xde, k),
    }
    let mut budget = VALUES;
    for _ in 0..k.min(8) {
        let pos = match rng.below(10) {
            0 => rng.pick(&[0, n + 1, u64::MAX]),
            _ => 1 + rng.below(n.max(1)),
        };
        if rng.chance(95) {
            write_uint(&mut out, pos);
        } else {
            value(rng, &mut out, 0, &mut budget);
        }
        value(rng, &mut out, 0, &mut budget);
    }
    if rng.chance(5) {
        let n = 1 + rng.index(4);
        let tail = rng.bytes(n);
        out.extend_from_slice(&tail);
    }
    out
}

fn write_uint(out: &mut Vec<u8>, x: u64) {
    // writing to a Vec cannot fail
    let _ = rmp::encode::write_uint(out, x);
}

/// A container header: the fix form, 16 or 32 bits (`wide` is the 16-bit
/// marker; the 32-bit one follows it).
fn header(out: &mut Vec<u8>, fix: u8, wide: u8, count: u64) {
    if count < 16 {
        out.push(fix | count as u8);
    } else if count < 65536 {
        out.push(wide);
        out.extend_from_slice(&(count as u16).to_be_bytes());
    } else {
        out.push(wide + 1);
        out.extend_from_slice(&(count as u32).to_be_bytes());
    }
}

/// Any one value, or something that claims to be one; `depth` containers
/// enclose it, and containers are written while `budget` lasts.
fn value(rng: &mut Rng, out: &mut Vec<u8>, depth: usize, budget: &mut usize) {
    *budget = budget.saturating_sub(1);
    let nest = depth < 8 && *budget > 0;
    match rng.below(22) {
        0 => out.push(rng.below(128) as u8),
        1 => out.push(0xe0 | rng.below(32) as u8),
        2 => out.push(rng.pick(&[0xc0, 0xc1, 0xc2, 0xc3])),
        3 => {
            // an unsigned or signed int of 1 to 8 bytes
            let width = rng.pick(&[1usize, 2, 4, 8]);
            let marker = match width {
                1 => 0xcc,
                2 => 0xcd,
                4 => 0xce,
                _ => 0xcf,
            } + rng.pick(&[0, 4]);
            out.push(marker);
            out.extend_from_slice(&rng.next().to_be_bytes()[8 - width..]);
        }
        4 => {
            out.push(0xca);
            out.extend_from_slice(&(rng.next() as u32).to_be_bytes());
        }
        5 => {
            // any float64: NaNs of every payload, ±0, ±inf, subnormals
            let bits = match rng.below(4) {
                0 => rng.pick(&[
                    0x7ff8_0000_0000_0000,
                    0xfff8_0000_0000_0000,
                    0xfffa_0000_1234_5678,
                    0x7ff0_0000_0000_0001,
                    0x8000_0000_0000_0000,
                    0x7ff0_0000_0000_0000,
                    0xfff0_0000_0000_0000,
                    0x0000_0000_0000_0001,
                ]),
                _ => rng.next(),
            };
            out.push(0xcb);
            out.extend_from_slice(&bits.to_be_bytes());
        }
        6 | 7 => {
            // a str or bin whose length may be wrong
            let len = rng.index(40);
            let said = if rng.chance(85) {
                len as u64
            } else {
                rng.pick(COUNTS)
            };
            // (header() writes neither as a fix form: s >= 256 there)
            match (rng.below(2), said) {
                (0, s) if s < 32 => out.push(0xa0 | s as u8),
                (0, s) if s < 256 => out.extend_from_slice(&[0xd9, s as u8]),
                (0, s) => header(out, 0, 0xda, s),
                (_, s) if s < 256 => out.extend_from_slice(&[0xc4, s as u8]),
                (_, s) => header(out, 0, 0xc5, s),
            }
            let bytes = rng.bytes(len);
            out.extend_from_slice(&bytes);
        }
        8 => {
            // an ext: mostly type 1 (a borrowed string) with a 4-byte index
            let ty = if rng.chance(70) { 1 } else { rng.next() as u8 };
            let len = if rng.chance(70) {
                4
            } else {
                rng.pick(&[0usize, 1, 2, 3, 5, 8, 16, 17])
            };
            match len {
                1 => out.push(0xd4),
                2 => out.push(0xd5),
                4 => out.push(0xd6),
                8 => out.push(0xd7),
                16 => out.push(0xd8),
                _ => out.extend_from_slice(&[0xc7, len as u8]),
            }
            out.push(ty);
            let data = if len == 4 && rng.chance(70) {
                (rng.below(5) as u32).to_be_bytes().to_vec()
            } else {
                rng.bytes(len)
            };
            out.extend_from_slice(&data);
        }
        9..=12 if nest => {
            let count = container_count(rng);
            header(out, 0x90, 0xdc, count);
            for _ in 0..count.min(6) {
                value(rng, out, depth + 1, budget);
            }
        }
        13..=16 if nest => {
            let count = container_count(rng);
            header(out, 0x80, 0xde, count);
            for _ in 0..count.min(6) {
                value(rng, out, depth + 1, budget);
                value(rng, out, depth + 1, budget);
            }
        }
        17 => nesting_bomb(rng, out),
        18 => {
            // a huge count or length and nothing after it
            let m = rng.pick(&[0xc6, 0xc9, 0xdb, 0xdd, 0xdf]);
            out.push(m);
            out.extend_from_slice(
                &rng.pick(&[0xffff_ffffu32, 0x7fff_ffff, 0x0100_0000])
                    .to_be_bytes(),
            );
        }
        19 => {
            let n = 1 + rng.index(8);
            let junk = rng.bytes(n);
            out.extend_from_slice(&junk);
        }
        _ => out.push(rng.below(128) as u8),
    }
}

fn container_count(rng: &mut Rng) -> u64 {
    if rng.chance(85) {
        rng.below(7)
    } else {
        rng.pick(COUNTS)
    }
}

/// Containers nested around the depth limit and far past it.
fn nesting_bomb(rng: &mut Rng, out: &mut Vec<u8>) {
    let depth = rng.pick(&[99usize, 100, 101, 150, 1000, 100_000]);
    match rng.below(3) {
        0 => out.extend(std::iter::repeat_n(0x91, depth)),
        1 => {
            // maps whose values nest
            for _ in 0..depth {
                out.extend_from_slice(&[0x81, 0xc3]);
            }
        }
        _ => {
            // maps whose keys nest
            out.extend(std::iter::repeat_n(0x81, depth));
        }
    }
    out.push(0x01);
}
