//! One input of a seed and its check: the Lua values of a round trip
//! (from tests/fixtures/propgen.lua) or the bytes of a payload for the
//! decoder (inputs.rs), both through the codec of codec.rs.

use crate::codec::{self, Payload};
use crate::inputs::{self, Rng};
use crate::slices::report;
use mlua::{Function, Lua, MultiValue, Table, Value};

const SHRINK_TRIES: usize = 2000;
/// propgen.args options: smaller values than through nginx, so that the
/// round trips are many.
const GEN_OPTS: &str = "return { budget = 20, long = 0.002, many = 0.002 }";

/// What a seed's input is, and its counter.
#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    RoundTrip = 1,
    Mutated,
    Structured,
    Random,
}

pub fn kind_of(seed: u64) -> Kind {
    match Rng::new(seed).below(10) {
        0..=3 => Kind::RoundTrip,
        4..=6 => Kind::Mutated,
        7 | 8 => Kind::Structured,
        _ => Kind::Random,
    }
}

fn hex(bytes: &[u8]) -> String {
    const MAX: usize = 2048;
    let mut s: String = bytes.iter().take(MAX).map(|b| format!("{b:02x}")).collect();
    if bytes.len() > MAX {
        s.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    s
}

/// A Lua state with propgen, and the inputs' checks.
pub struct Fuzzer {
    lua: Lua,
    args: Function,
    same: Function,
    show: Function,
    shrink: Function,
    opts: Table,
    /// Three strings that borrowed-string indexes 0..2 of random inputs
    /// find.
    donor: Payload,
    /// The valid payload that mutations start from, by its seed.
    base: Option<(u64, Payload)>,
}

/// Round trip of one argument list: Ok(Ok) when equal, Ok(Err(why)) when not.
type Check = mlua::Result<Result<(), String>>;

impl Fuzzer {
    pub fn new() -> mlua::Result<Fuzzer> {
        // SAFETY: unsafe_new only adds the ffi library, which propgen uses
        // as pool-thread code does; the state stays on this thread.
        let lua = unsafe { Lua::unsafe_new() };
        let gen: Table = lua
            .load(include_str!("../fixtures/propgen.lua"))
            .set_name("propgen")
            .call(())?;
        let opts = lua.load(GEN_OPTS).eval()?;
        let donor = lua
            .load(r#"return "donor 0", "donor 1", "\0donor 2""#)
            .eval()?;
        Ok(Fuzzer {
            args: gen.get("args")?,
            same: gen.get("same")?,
            show: gen.get("show")?,
            shrink: gen.get("shrink")?,
            opts,
            donor: codec::encode(&lua, &donor, Some(1)).map_err(mlua::Error::runtime)?,
            base: None,
            lua,
        })
    }

    fn show(&self, list: &Table) -> mlua::Result<String> {
        self.show.call(list)
    }

    /// The argument list of a seed, `{ n = ..., ... }`.
    fn list(&self, seed: u64) -> mlua::Result<Table> {
        self.args.call((seed as f64, &self.opts))
    }

    /// Where a seed's round trip borrows strings from, if it does.
    fn borrow_of(seed: u64) -> Option<usize> {
        let mut rng = Rng::new(seed ^ 0xb0_88_0b);
        rng.chance(60).then(|| 1 + rng.index(64))
    }

    fn borrowing(borrow: Option<usize>) -> String {
        borrow.map_or("copying strings".into(), |min| {
            format!("borrowing strings from {min} bytes")
        })
    }

    /// Encodes `list` and decodes the payload back, in the same state.
    fn round_trip(lua: &Lua, same: &Function, list: &Table, borrow: Option<usize>) -> Check {
        let vals = unpack(list)?;
        let payload = match codec::encode(lua, &vals, borrow) {
            Ok(p) => p,
            Err(e) => return Ok(Err(format!("refused to encode: {e}"))),
        };
        let back = match codec::decode(lua, &payload.bytes, &payload) {
            Ok(v) => v,
            Err(e) => return Ok(Err(format!("refused its own payload: {e}"))),
        };
        let (ok, diff): (bool, Option<String>) = same.call((list, packed(lua, &back)?))?;
        Ok(if ok {
            Ok(())
        } else {
            Err(diff.unwrap_or_default())
        })
    }

    /// The round trip of a seed's values; on failure, the text to print.
    fn values(&self, seed: u64, verbose: bool) -> Check {
        let list = self.list(seed)?;
        let borrow = Self::borrow_of(seed);
        if verbose {
            report(&format!(
                "input: values ({}): {}",
                Self::borrowing(borrow),
                self.show(&list)?
            ));
            if let Ok(p) = codec::encode(&self.lua, &unpack(&list)?, borrow) {
                report(&format!("payload: {}", hex(&p.bytes)));
            }
        }
        let Err(diff) = Self::round_trip(&self.lua, &self.same, &list, borrow)? else {
            return Ok(Ok(()));
        };
        let same = self.same.clone();
        let fails = self.lua.create_function(move |lua, list: Table| {
            Ok(Self::round_trip(lua, &same, &list, borrow)?.is_err())
        })?;
        let (small, tried): (Table, usize) = self.shrink.call((&list, fails, SHRINK_TRIES))?;
        let small_diff = Self::round_trip(&self.lua, &self.same, &small, borrow)?
            .err()
            .unwrap_or_default();
        let small_payload = codec::encode(&self.lua, &unpack(&small)?, borrow)
            .map_or_else(|e| format!("(refused: {e})"), |p| hex(&p.bytes));
        Ok(Err(format!(
            "round trip ({}): {diff}\n  value: {}\n  smallest failing value \
             ({tried} tried): {}\n  which gives: {small_diff}\n  its payload: {small_payload}",
            Self::borrowing(borrow),
            self.show(&list)?,
            self.show(&small)?,
        )))
    }

    /// Makes `self.base` the valid payload that the mutations of `seed`
    /// start from: the values of another seed, shared by 32 seeds in a row.
    fn make_base(&mut self, seed: u64) -> mlua::Result<()> {
        let base_seed = (1 << 40) + seed / 32;
        if self.base.as_ref().is_none_or(|(s, _)| *s != base_seed) {
            let vals = unpack(&self.list(base_seed)?)?;
            let mut payload = codec::encode(&self.lua, &vals, (base_seed % 2 == 1).then_some(8))
                .map_err(mlua::Error::runtime)?;
            payload.bytes = inputs::canonical(&payload.bytes);
            self.base = Some((base_seed, payload));
        }
        Ok(())
    }

    /// Decodes bytes whose borrowed strings are those of `strings`.
    fn decode(&self, bytes: &[u8], strings: &Payload) -> mlua::Result<Outcome> {
        let vals = match codec::decode(&self.lua, bytes, strings) {
            Ok(vals) => vals,
            Err(e) if e.len() > "bad payload: ".len() && e.starts_with("bad payload: ") => {
                return Ok(Outcome::Refused)
            }
            Err(e) => {
                return Ok(Outcome::Failed(format!(
                    "refused without a \"bad payload: \" text: {e:?}"
                )))
            }
        };
        let list = packed(&self.lua, &vals)?;
        Ok(
            match Self::round_trip(&self.lua, &self.same, &list, None)? {
                Ok(()) => Outcome::Accepted,
                Err(e) => Outcome::Failed(format!(
                    "accepted {}, which do not cross again: {e}",
                    self.show(&list)?
                )),
            },
        )
    }

    /// Checks the input of `seed`.
    pub fn check(&mut self, seed: u64, kind: Kind, verbose: bool) -> mlua::Result<Outcome> {
        if kind == Kind::RoundTrip {
            return Ok(match self.values(seed, verbose)? {
                Ok(()) => Outcome::Passed,
                Err(why) => Outcome::Failed(why),
            });
        }
        let mut rng = Rng::new(seed);
        rng.next();
        self.make_base(seed)?;
        let base = &self.base.as_ref().expect("made").1;
        let (bytes, what, strings) = match kind {
            Kind::Mutated => (
                inputs::mutate(&mut rng, &base.bytes),
                "mutated payload",
                base,
            ),
            Kind::Structured => (
                inputs::structured(&mut rng),
                "structured payload",
                &self.donor,
            ),
            _ => (inputs::random(&mut rng), "random bytes", &self.donor),
        };
        let input = || format!("{what} ({} bytes): {}", bytes.len(), hex(&bytes));
        if verbose {
            report(&format!("input: {}", input()));
        }
        Ok(match self.decode(&bytes, strings)? {
            Outcome::Failed(why) => Outcome::Failed(format!("{why}\n  input: {}", input())),
            outcome => outcome,
        })
    }
}

/// What became of one input.
pub enum Outcome {
    /// Values that crossed intact.
    Passed,
    /// Bytes the decoder took, whose values cross again intact.
    Accepted,
    /// Bytes the decoder refused with a "bad payload: ..." text.
    Refused,
    Failed(String),
}

/// The values of a packed list.
fn unpack(list: &Table) -> mlua::Result<MultiValue> {
    let n: usize = list.raw_get("n")?;
    (1..=n).map(|i| list.raw_get::<Value>(i)).collect()
}

/// A packed list of values: `{ n = ..., ... }`.
fn packed(lua: &Lua, vals: &MultiValue) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("n", vals.len())?;
    for (i, v) in vals.iter().enumerate() {
        t.raw_set(i + 1, v)?;
    }
    Ok(t)
}
