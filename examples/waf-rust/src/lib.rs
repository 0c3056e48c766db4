//! The example WAF of nginx-conf/waf.lua on the regex crate: the same
//! rules (read from the same waf_rules.lua), the same subjects, the same
//! verdict.
//!
//! src/handler.rs makes it a pool handler (`thread_pool_process_by_rust`)
//! with the handler crate (handler/).
//!
//! ```no_run
//! use waf_rust::{Value, Waf};
//!
//! let waf = Waf::from_file("nginx-conf/waf_rules.lua").unwrap();
//! let req = Value::Table(vec![(Value::Str(b"uri"), Value::Str(b"/.git/config"))]);
//! assert_eq!(waf.scan(&req).unwrap(), Some(vec![70001]));
//! ```

mod handler;
mod pcre;
mod request;
mod rules;
mod waf;

pub use pcre::{translate, Unsupported};
pub use request::{for_each_subject, NotATable, Value};
pub use rules::{parse, Rule, RuleList, RulesError, Target};
pub use waf::{Waf, WafError};
