//! The WAF: every rule of the rule file compiled into one
//! `regex::bytes::RegexSet` per target, the extra rules of the latest
//! update into sets of their own, and the verdict waf.lua gives.

use std::fmt;

use regex::bytes::RegexSet;

use crate::pcre::{self, Unsupported};
use crate::request::{for_each_subject, NotATable, Value};
use crate::rules::{self, Rule, RulesError, Target};

/// Why a WAF could not be built from a rule file.
#[derive(Debug)]
pub enum WafError {
    /// The file could not be read.
    Read(std::io::Error),
    /// The file is not a rule file.
    Rules(RulesError),
    /// A rule's pattern has no equivalent on the regex crate.
    Unsupported { id: u32, why: Unsupported },
    /// The regex crate refused a rule (or the set, with id None).
    Compile { id: Option<u32>, why: regex::Error },
}

impl fmt::Display for WafError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WafError::Read(e) => write!(f, "cannot read the rule file: {e}"),
            WafError::Rules(e) => write!(f, "rule file: {e}"),
            WafError::Unsupported { id, why } => write!(f, "waf rule {id}: {why}"),
            WafError::Compile { id: Some(id), why } => write!(f, "waf rule {id}: {why}"),
            WafError::Compile { id: None, why } => write!(f, "waf rules: {why}"),
        }
    }
}

impl std::error::Error for WafError {}

/// One target's rules as one set.
struct TargetSet {
    set: RegexSet,
    /// The position in `Waf::rules` of each pattern of `set`, ascending.
    rule_of: Vec<usize>,
}

/// The compiled rules. Matching takes `&self`; a pool builds one per
/// thread all the same, as waf.lua compiles its patterns per thread.
pub struct Waf {
    /// The rule file's, then the extras.
    rules: Vec<Rule>,
    /// How many of `rules` are the file's.
    file_rules: usize,
    /// The file's rules by `Target::index`; the extras are apart, so that
    /// replacing them compiles only them.
    file_sets: Vec<TargetSet>,
    extra_sets: Vec<TargetSet>,
}

impl Waf {
    /// Reads and compiles a rule file (nginx-conf/waf_rules.lua).
    pub fn from_file(path: &str) -> Result<Waf, WafError> {
        let src = std::fs::read(path).map_err(WafError::Read)?;
        Waf::new(rules::parse(&src).map_err(WafError::Rules)?)
    }

    /// Compiles `rules`, the rule file's; no extras.
    pub fn new(rules: Vec<Rule>) -> Result<Waf, WafError> {
        Ok(Waf {
            file_sets: compile(&rules, 0)?,
            extra_sets: compile(&[], rules.len())?,
            file_rules: rules.len(),
            rules,
        })
    }

    /// Makes `extras` the rules after the file's, in place of the previous
    /// extras: compiled first, so that a bad one leaves the WAF as it was.
    pub fn set_extras(&mut self, extras: Vec<Rule>) -> Result<(), WafError> {
        self.extra_sets = compile(&extras, self.file_rules)?;
        self.rules.truncate(self.file_rules);
        self.rules.extend(extras);
        Ok(())
    }

    /// The rules: the file's in file order, then the extras.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// waf.lua's verdict on the request table `req`: the ids of the rules
    /// that matched, in rule order, or None when none did.
    pub fn scan(&self, req: &Value<'_>) -> Result<Option<Vec<u32>>, NotATable> {
        let mut hit = vec![false; self.rules.len()];
        for target in Target::ALL {
            let sets = [
                &self.file_sets[target.index()],
                &self.extra_sets[target.index()],
            ];
            for_each_subject(req, target, |s| {
                for ts in sets {
                    for i in ts.set.matches(s).iter() {
                        hit[ts.rule_of[i]] = true;
                    }
                }
            })?;
        }
        let ids: Vec<u32> = (0..hit.len())
            .filter(|&i| hit[i])
            .map(|i| self.rules[i].id)
            .collect();
        Ok((!ids.is_empty()).then_some(ids))
    }
}

/// Compiles `rules`, which are `Waf::rules` from `first` on: each pattern
/// alone first, so that a bad one is named, then one set per target.
fn compile(rules: &[Rule], first: usize) -> Result<Vec<TargetSet>, WafError> {
    let mut patterns = Vec::with_capacity(rules.len());
    for rule in rules {
        let p = pcre::translate(&rule.pattern)
            .map_err(|why| WafError::Unsupported { id: rule.id, why })?;
        regex::bytes::Regex::new(&p).map_err(|why| WafError::Compile {
            id: Some(rule.id),
            why,
        })?;
        patterns.push(p);
    }
    Target::ALL
        .iter()
        .map(|&target| {
            let of_target: Vec<usize> = (0..rules.len())
                .filter(|&i| rules[i].targets.contains(&target))
                .collect();
            let set = RegexSet::new(of_target.iter().map(|&i| &patterns[i]))
                .map_err(|why| WafError::Compile { id: None, why })?;
            let rule_of = of_target.iter().map(|&i| first + i).collect();
            Ok(TargetSet { set, rule_of })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository's rule file: every rule has an equivalent here.
    #[test]
    fn compiles_every_rule_of_the_rule_file() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../nginx-conf/waf_rules.lua"
        );
        let t0 = std::time::Instant::now();
        let waf = Waf::from_file(path).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{} rules in {:?}", waf.rules().len(), t0.elapsed());
        assert!(waf.rules().len() > 1000);
        let req = Value::Table(vec![(Value::Str(b"uri"), Value::Str(b"/.git/config"))]);
        assert_eq!(waf.scan(&req), Ok(Some(vec![70001])));
    }

    /// Inputs that make a backtracking engine work for minutes (PCRE took
    /// over 120 s of CPU on 60 KB of "<a " in waf.lua, and gave up on some
    /// rules of "../" by its JIT stack limit): linear time here.
    #[test]
    fn scans_backtracking_inputs_in_linear_time() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../nginx-conf/waf_rules.lua"
        );
        let waf = Waf::from_file(path).unwrap_or_else(|e| panic!("{e}"));
        for unit in ["<a ", "../", "select a from b where ", "${j${", "{{"] {
            let body = unit.repeat(60_000 / unit.len());
            let req = Value::Table(vec![(Value::Str(b"body"), Value::Str(body.as_bytes()))]);
            let t0 = std::time::Instant::now();
            waf.scan(&req).unwrap();
            let took = t0.elapsed();
            // Generous for a shared machine: a scan takes milliseconds.
            assert!(
                took < std::time::Duration::from_secs(2),
                "{unit:?}: {took:?}"
            );
        }
    }
}
