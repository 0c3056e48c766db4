//! `thread_pool_*_by_lua_block POOL { ... }`: reading Lua code out of the
//! nginx configuration.
//!
//! nginx's tokenizer cannot read Lua (it splits words at `;` and treats
//! quotes and braces its own way), so a block directive takes over the
//! configuration buffer right after its `{` and reads up to the matching
//! `}`. Only braces in Lua code count: those inside strings (`"..."`,
//! `'...'`, `[[...]]`, `[==[...]==]`) and comments (`-- ...`,
//! `--[[ ... ]]`) do not. The scanner takes one byte at a time, so a block
//! and a long string in it may span any number of the 4 KiB buffers nginx
//! reads configuration files in.
//!
//! As in lua-nginx-module, the code is everything between the braces, so Lua
//! line 1 is the rest of the line of the `{`, and the chunk is named after
//! that line: an error on Lua line N is on file line `start + N - 1`.

use crate::ngx::conf::{Conf, Input};

/// The code of a block and the line of its closing `}`.
#[derive(Debug, PartialEq, Eq)]
pub struct Block {
    pub code: Vec<u8>,
    pub end_line: usize,
}

/// Why a block could not be read, and the line to blame.
#[derive(Debug, PartialEq, Eq)]
pub struct BlockError {
    pub line: usize,
    pub msg: String,
}

/// Where the scanner is in the Lua code.
#[derive(Clone, Copy, Debug)]
enum State {
    Code,
    /// After one `-`.
    Dash,
    /// After `--`.
    CommentStart,
    LineComment,
    /// After `[` (or `--[`) and `level` `=` signs: maybe a long bracket.
    Open {
        level: usize,
        comment: bool,
    },
    /// Inside a long string or comment of `level`.
    Long {
        level: usize,
        comment: bool,
    },
    /// Inside a long string or comment, after `]` and `seen` `=` signs.
    Close {
        level: usize,
        comment: bool,
        seen: usize,
    },
    /// Inside a short string opened by `quote`.
    Short {
        quote: u8,
    },
    /// After a backslash in a short string.
    Escape {
        quote: u8,
    },
    /// After a backslash and a newline byte `first`: the other newline byte
    /// right after it belongs to the same line end (`\r\n`, `\n\r`).
    EscapedNewline {
        quote: u8,
        first: u8,
    },
    /// After `\z`: whitespace, newlines included, is skipped.
    SkipSpace {
        quote: u8,
    },
}

/// What a byte does to the scanner.
enum Next {
    /// The byte is consumed.
    Stay(State),
    /// The byte is looked at again in the new state.
    Redo(State),
    /// The byte is the block's closing `}`.
    Closed,
}

struct Scanner {
    state: State,
    /// Unclosed `{` inside the block.
    depth: usize,
    line: usize,
    /// The line where the current string or comment opened.
    since: usize,
}

impl Scanner {
    /// Feeds one byte; returns true when it closes the block.
    fn step(&mut self, b: u8) -> bool {
        if b == b'\n' {
            self.line += 1;
        }
        loop {
            match self.next(b) {
                Next::Stay(s) => {
                    self.state = s;
                    return false;
                }
                Next::Redo(s) => self.state = s,
                Next::Closed => return true,
            }
        }
    }

    /// What byte `b` does in the current state.
    ///
    /// Long: one match over the states, an arm each, as Lua's lexer reads
    /// strings, long brackets and comments; split, a state's transitions
    /// would be read across functions.
    fn next(&mut self, b: u8) -> Next {
        use State::*;
        match self.state {
            Code => match b {
                b'{' => {
                    self.depth += 1;
                    Next::Stay(Code)
                }
                b'}' if self.depth == 0 => Next::Closed,
                b'}' => {
                    self.depth -= 1;
                    Next::Stay(Code)
                }
                b'-' => Next::Stay(Dash),
                b'[' => {
                    self.since = self.line;
                    Next::Stay(Open {
                        level: 0,
                        comment: false,
                    })
                }
                b'"' | b'\'' => {
                    self.since = self.line;
                    Next::Stay(Short { quote: b })
                }
                _ => Next::Stay(Code),
            },
            Dash if b == b'-' => Next::Stay(CommentStart),
            Dash => Next::Redo(Code),
            CommentStart if b == b'[' => {
                self.since = self.line;
                Next::Stay(Open {
                    level: 0,
                    comment: true,
                })
            }
            CommentStart | LineComment => match b {
                b'\n' | b'\r' => Next::Stay(Code),
                _ => Next::Stay(LineComment),
            },
            Open { level, comment } => match b {
                b'=' => Next::Stay(Open {
                    level: level + 1,
                    comment,
                }),
                b'[' => Next::Stay(Long { level, comment }),
                // Not a long bracket: `--[x` is a line comment, `[x` code.
                _ if comment => Next::Redo(LineComment),
                _ => Next::Redo(Code),
            },
            Long { level, comment } => match b {
                b']' => Next::Stay(Close {
                    level,
                    comment,
                    seen: 0,
                }),
                _ => Next::Stay(Long { level, comment }),
            },
            Close {
                level,
                comment,
                seen,
            } => match b {
                b'=' => Next::Stay(Close {
                    level,
                    comment,
                    seen: seen + 1,
                }),
                b']' if seen == level => Next::Stay(Code),
                // `]==]` of another level: this `]` may start the right one.
                b']' => Next::Stay(Close {
                    level,
                    comment,
                    seen: 0,
                }),
                _ => Next::Stay(Long { level, comment }),
            },
            Short { quote } => match b {
                b'\\' => Next::Stay(Escape { quote }),
                // An unescaped line end ends the string for us; Lua reports
                // it as unfinished when the block is compiled.
                b'\n' | b'\r' => Next::Stay(Code),
                _ if b == quote => Next::Stay(Code),
                _ => Next::Stay(Short { quote }),
            },
            Escape { quote } => match b {
                b'z' => Next::Stay(SkipSpace { quote }),
                b'\n' | b'\r' => Next::Stay(EscapedNewline { quote, first: b }),
                _ => Next::Stay(Short { quote }),
            },
            EscapedNewline { quote, first } => match b {
                b'\n' | b'\r' if b != first => Next::Stay(Short { quote }),
                _ => Next::Redo(Short { quote }),
            },
            SkipSpace { quote } => match b {
                b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c' => Next::Stay(SkipSpace { quote }),
                _ => Next::Redo(Short { quote }),
            },
        }
    }

    /// The error for input ending in the current state.
    fn eof_error(&self, start_line: usize) -> BlockError {
        match self.state {
            State::Long { level, comment } | State::Close { level, comment, .. } => BlockError {
                line: self.since,
                msg: format!(
                    "is not closed: unexpected end of file inside the Lua long {} \
                     opened by \"{}[{}[\"",
                    if comment { "comment" } else { "string" },
                    if comment { "--" } else { "" },
                    "=".repeat(level),
                ),
            },
            _ => BlockError {
                line: start_line,
                msg: "is not closed: unexpected end of file, expecting \"}\"".into(),
            },
        }
    }
}

/// Reads a Lua block from `input`, which is just past its `{` on line
/// `start_line`, through its closing `}`; leaves `input` right after it.
pub fn read_block(input: &mut impl Input, start_line: usize) -> Result<Block, BlockError> {
    let mut scanner = Scanner {
        state: State::Code,
        depth: 0,
        line: start_line,
        since: start_line,
    };
    let mut code = Vec::new();
    loop {
        let buf = input.fill().map_err(|msg| BlockError {
            line: scanner.line,
            msg,
        })?;
        if buf.is_empty() {
            return Err(scanner.eof_error(start_line));
        }
        match buf.iter().position(|&b| scanner.step(b)) {
            Some(end) => {
                code.extend_from_slice(&buf[..end]);
                input.consume(end + 1);
                return Ok(Block {
                    code,
                    end_line: scanner.line,
                });
            }
            None => {
                code.extend_from_slice(buf);
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

/// Reads the block of the directive being parsed from nginx's buffer.
/// nginx's line counter follows: past the block on success, on the line to
/// blame on error (nginx names it when it logs the setter's error).
pub fn read(cf: Conf) -> Result<Vec<u8>, String> {
    let start = cf.line();
    match read_block(&mut cf.reader(), start) {
        Ok(block) => {
            cf.set_line(block.end_line);
            Ok(block.code)
        }
        Err(e) => {
            cf.set_line(e.line);
            Err(e.msg)
        }
    }
}

/// LuaJIT's LUA_IDSIZE: a `=name` chunk name is cut to this many bytes
/// less one (the `=`) in messages.
const LUA_IDSIZE: usize = 60;

/// The Lua line number of an error message of chunk `name` (a `=name`),
/// e.g. 3 in `thread_pool_process_by_lua(nginx.conf:12):3: ...`.
pub fn error_line(name: &str, msg: &str) -> Option<usize> {
    let source = name.as_bytes().get(1..name.len().min(LUA_IDSIZE))?;
    let rest = msg.as_bytes().strip_prefix(source)?.strip_prefix(b":")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if rest.get(digits) != Some(&b':') {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration file read through a buffer of `size` bytes, refilled
    /// only when all of it was consumed, as nginx does.
    struct Buffered<'a> {
        data: &'a [u8],
        pos: usize,
        last: usize,
        size: usize,
    }

    impl<'a> Buffered<'a> {
        fn new(data: &'a [u8], size: usize) -> Self {
            Buffered {
                data,
                pos: 0,
                last: 0,
                size,
            }
        }
    }

    impl Input for Buffered<'_> {
        fn fill(&mut self) -> Result<&[u8], String> {
            if self.pos >= self.last {
                self.last = (self.pos + self.size).min(self.data.len());
            }
            Ok(&self.data[self.pos..self.last])
        }

        fn consume(&mut self, n: usize) {
            assert!(self.pos + n <= self.last, "consumed more than filled");
            self.pos += n;
        }
    }

    /// Reads a block from `text` (just past the `{`, on line 10) through
    /// buffers of each of several sizes; all must agree. Returns the block
    /// and what is left after it.
    fn read_at_sizes(text: &str) -> Result<(String, usize, String), BlockError> {
        let mut first = None;
        for size in [1, 2, 3, 7, 4096] {
            let mut input = Buffered::new(text.as_bytes(), size);
            let got = read_block(&mut input, 10).map(|b| {
                (
                    String::from_utf8(b.code).unwrap(),
                    b.end_line,
                    text[input.pos..].to_string(),
                )
            });
            match &first {
                None => first = Some(got),
                Some(f) => assert_eq!(f, &got, "buffer size {size}"),
            }
        }
        first.unwrap()
    }

    fn code_of(text: &str) -> String {
        read_at_sizes(text).unwrap().0
    }

    #[test]
    fn stops_at_the_matching_brace_and_leaves_the_rest() {
        let (code, end, rest) =
            read_at_sizes("\n  local t = { a = { 1 } }\n  return t\n}\nserver { }").unwrap();
        assert_eq!(code, "\n  local t = { a = { 1 } }\n  return t\n");
        assert_eq!(end, 13);
        assert_eq!(rest, "\nserver { }");
    }

    #[test]
    fn empty_block() {
        assert_eq!(read_at_sizes("}x").unwrap(), ("".into(), 10, "x".into()));
    }

    #[test]
    fn braces_in_short_strings_do_not_count() {
        assert_eq!(code_of(r#" local s = "}" }"#), r#" local s = "}" "#);
        assert_eq!(code_of(r#" local s = '{' }"#), r#" local s = '{' "#);
        assert_eq!(code_of(r#" local s = "\"}" }"#), r#" local s = "\"}" "#);
        assert_eq!(code_of(r#" local s = '\'{\\' }"#), r#" local s = '\'{\\' "#);
        assert_eq!(code_of(r#" local s = "'}'" }"#), r#" local s = "'}'" "#);
    }

    #[test]
    fn escaped_line_ends_continue_a_short_string() {
        assert_eq!(code_of("s = \"a\\\n}\" }"), "s = \"a\\\n}\" ");
        assert_eq!(code_of("s = \"a\\\r\n}\" }"), "s = \"a\\\r\n}\" ");
        assert_eq!(code_of("s = \"a\\z \n\t }\" }"), "s = \"a\\z \n\t }\" ");
    }

    #[test]
    fn an_unescaped_line_end_ends_a_short_string() {
        // Lua rejects the string; the block still ends where it should, so
        // the compiler reports the real mistake.
        let (code, end, _) = read_at_sizes(" s = \"abc\n}").unwrap();
        assert_eq!(code, " s = \"abc\n");
        assert_eq!(end, 11);
    }

    #[test]
    fn braces_in_long_strings_do_not_count() {
        assert_eq!(code_of(" s = [[ } ]] }"), " s = [[ } ]] ");
        assert_eq!(
            code_of(" s = [==[ ]] } ]=] ]==] }"),
            " s = [==[ ]] } ]=] ]==] "
        );
        assert_eq!(code_of(" s = [=[ ]]=] }"), " s = [=[ ]]=] ");
        assert_eq!(code_of(" s = [[\n{\n\"\n]] }"), " s = [[\n{\n\"\n]] ");
    }

    #[test]
    fn brackets_that_are_not_long_brackets() {
        assert_eq!(code_of(" t[ [[}]] ] = 1 }"), " t[ [[}]] ] = 1 ");
        assert_eq!(code_of(" x = t[1] + t[-1] }"), " x = t[1] + t[-1] ");
        assert_eq!(code_of(" x = t['}'] }"), " x = t['}'] ");
    }

    #[test]
    fn braces_in_comments_do_not_count() {
        assert_eq!(code_of(" -- } {\n x = 1 }"), " -- } {\n x = 1 ");
        assert_eq!(code_of(" --[[ } \n { ]] x = 1 }"), " --[[ } \n { ]] x = 1 ");
        assert_eq!(code_of(" --[==[ ]] } ]==] }"), " --[==[ ]] } ]==] ");
        assert_eq!(code_of(" --[ not long }\n}"), " --[ not long }\n");
        assert_eq!(code_of(" --[= not long }\n}"), " --[= not long }\n");
        assert_eq!(code_of(" -- \"\n}"), " -- \"\n");
        assert_eq!(code_of(" x = 1 - -1 }"), " x = 1 - -1 ");
    }

    #[test]
    fn crlf_lines() {
        let (code, end, rest) = read_at_sizes("\r\n-- }\r\nx = '}'\r\n}\r\n").unwrap();
        assert_eq!(code, "\r\n-- }\r\nx = '}'\r\n");
        assert_eq!(end, 13);
        assert_eq!(rest, "\r\n");
    }

    #[test]
    fn unclosed_block_blames_its_first_line() {
        let err = read_at_sizes("\n local t = { 1 \n return t\n}\n").unwrap_err();
        assert_eq!(err.line, 10);
        assert!(
            err.msg.contains("unexpected end of file, expecting \"}\""),
            "{}",
            err.msg
        );
        let err = read_at_sizes(" x = 1 -- }").unwrap_err();
        assert_eq!(err.line, 10);
    }

    #[test]
    fn unclosed_long_string_blames_its_opening() {
        let err = read_at_sizes("\n\n s = [==[ ]] ]=] }\n}\n").unwrap_err();
        assert_eq!(err.line, 12);
        assert!(
            err.msg.contains("long string opened by \"[==[\""),
            "{}",
            err.msg
        );
        let err = read_at_sizes("\n --[[ }\n").unwrap_err();
        assert_eq!(err.line, 11);
        assert!(
            err.msg.contains("long comment opened by \"--[[\""),
            "{}",
            err.msg
        );
    }

    #[test]
    fn block_larger_than_the_conf_buffer() {
        let mut text = String::from("\n  local t = {\n");
        let mut i = 0;
        while text.len() < 20 * 1024 {
            text.push_str(&format!(
                "    {{ id = {i}, s = \"}}{{\", l = [==[ ]] }} ]==] }}, -- }} {{\n"
            ));
            i += 1;
        }
        text.push_str("  }\n  return #t\n");
        let body = text.clone();
        text.push_str("}\n# after\n");
        let mut input = Buffered::new(text.as_bytes(), 4096);
        let block = read_block(&mut input, 5).unwrap();
        assert_eq!(String::from_utf8(block.code).unwrap(), body);
        assert_eq!(block.end_line, 5 + body.matches('\n').count());
        assert_eq!(&text[input.pos..], "\n# after\n");
    }

    #[test]
    fn input_errors_are_passed_on() {
        struct Failing;
        impl Input for Failing {
            fn fill(&mut self) -> Result<&[u8], String> {
                Err("read failed".into())
            }
            fn consume(&mut self, _: usize) {}
        }
        let err = read_block(&mut Failing, 3).unwrap_err();
        assert_eq!(
            err,
            BlockError {
                line: 3,
                msg: "read failed".into()
            }
        );
    }

    #[test]
    fn error_line_of_a_chunk() {
        let name = "=thread_pool_process_by_lua(nginx.conf:12)";
        assert_eq!(
            error_line(
                name,
                "thread_pool_process_by_lua(nginx.conf:12):3: '=' expected"
            ),
            Some(3)
        );
        assert_eq!(error_line(name, "other(nginx.conf:12):3: x"), None);
        assert_eq!(
            error_line(name, "thread_pool_process_by_lua(nginx.conf:12): x"),
            None
        );
        // LuaJIT cuts long names.
        let long = format!("=thread_pool_process_by_lua({}.conf:7)", "x".repeat(60));
        let shown = &long[1..LUA_IDSIZE];
        assert_eq!(error_line(&long, &format!("{shown}:41: x")), Some(41));
    }
}
