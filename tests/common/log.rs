//! The error log's verdict: the levels that fail a test, the patterns a
//! test expects, and the check every server's log goes through.

/// The levels at which a line in the error log is a failure unless its
/// test expects it (lua-nginx-module's tests: `--- no_error_log [error]`).
const ERROR_LEVELS: [&str; 4] = ["[error]", "[crit]", "[alert]", "[emerg]"];

/// Fails the test if `log` (an error log) shows a crash, a panic or any
/// line at level error or above.
pub fn assert_clean(log: &str) {
    assert_clean_but(log, &[]);
}

/// As assert_clean, letting through the error lines that match one of
/// `expected` (patterns, see `matches`): those the test provokes. A crash
/// fails it whatever it expects; a worker killed by a signal only if the
/// test does not expect it (one it killed itself).
pub fn assert_clean_but(log: &str, expected: &[&str]) {
    for bad in ["signal 11", "signal 6", "signal 7"] {
        assert!(!log.contains(bad), "error.log contains {bad:?}:\n{log}");
    }
    for line in log.lines() {
        let expected = expected.iter().any(|p| matches(line, p));
        assert!(
            expected || !line.contains("exited on signal"),
            "error.log has an unexpected exit:\n{line}\n\nerror.log:\n{log}"
        );
        let level = ERROR_LEVELS.iter().find(|l| line.contains(*l));
        if let Some(level) = level.filter(|_| !expected) {
            panic!("error.log has an unexpected {level} line:\n{line}\n\nerror.log:\n{log}");
        }
        assert!(
            expected || !line.contains("panic"),
            "error.log has an unexpected panic:\n{line}\n\nerror.log:\n{log}"
        );
    }
}

/// Whether `text` contains `pattern`, where a `*` in the pattern stands
/// for any run of characters: "init exploded" or "thread pool *: busy".
pub fn matches(text: &str, pattern: &str) -> bool {
    let mut rest = text;
    for piece in pattern.split('*') {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `text` is `pattern` whole, a `*` standing for any run of
/// characters.
pub fn matches_whole(text: &str, pattern: &str) -> bool {
    let pieces: Vec<&str> = pattern.split('*').collect();
    if pieces.len() == 1 {
        return text == pattern;
    }
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    text.len() >= first.len() + last.len()
        && text.starts_with(first)
        && text.ends_with(last)
        && matches(
            &text[first.len()..text.len() - last.len()],
            &pieces[1..pieces.len() - 1].join("*"),
        )
}
