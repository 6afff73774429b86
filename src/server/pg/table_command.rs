//! Gateway, the `TABLE name` command, and views named as views: between tokenizing a
//! client's SQL and parsing it, each `TABLE name` that stands where a query may start becomes
//! `SELECT * FROM name`, which Postgres defines it to mean, and `ALTER VIEW name RENAME TO`
//! and `COMMENT ON VIEW` (which the parser lacks) are spelled with `TABLE`, which Postgres
//! accepts for views too. The SQL parser reads `TABLE` itself only partly (it takes the next
//! three tokens whatever they are, so `TABLE x ORDER BY id` or `TABLE x; SELECT 1` break, and
//! the planner does not plan it at all). Only the keyword's token is replaced: the name
//! (quoted or not), comments and literals stay exactly as written. A statement that starts
//! with `ABORT` reads as the `ROLLBACK` Postgres defines it to be.

use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{
    Location, Token, TokenWithSpan, Tokenizer, Whitespace,
};

/// One token of a statement replaced before parsing: which (an index into the tokens as
/// tokenized, white space included), by what tokens, and how the replacement reads as text.
#[derive(Debug, Clone, PartialEq)]
pub struct Edit {
    at: usize,
    tokens: Vec<Token>,
    text: String,
}

impl Edit {
    fn keyword(at: usize, keyword: &str) -> Self {
        Edit {
            at,
            tokens: vec![Token::make_keyword(keyword)],
            text: keyword.to_string(),
        }
    }
}

/// Every edit `tokens` needs (see the module's doc), in the order of the tokens.
pub fn edits(tokens: &[TokenWithSpan]) -> Vec<Edit> {
    let significant: Vec<(usize, &TokenWithSpan)> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !matches!(t.token, Token::Whitespace(_) | Token::EOF))
        .collect();
    let mut out = table_commands(&significant);
    out.extend(views_as_tables(&significant));
    out.extend(aborts(&significant));
    out.sort_by_key(|e| e.at);
    out
}

/// `tokens` with `edits` (from [`edits`]) made; a replacement token takes the span of the
/// one it replaces, so that the parser's errors still point into the client's text.
pub fn apply(tokens: &mut Vec<TokenWithSpan>, edits: &[Edit]) {
    for edit in edits.iter().rev() {
        let Some(span) = tokens.get(edit.at).map(|t| t.span) else {
            continue;
        };
        let mut replacement = Vec::with_capacity(edit.tokens.len() * 2);
        for (i, token) in edit.tokens.iter().enumerate() {
            if i > 0 {
                replacement.push(TokenWithSpan::new(
                    Token::Whitespace(Whitespace::Space),
                    span,
                ));
            }
            replacement.push(TokenWithSpan::new(token.clone(), span));
        }
        tokens.splice(edit.at..edit.at + 1, replacement);
    }
}

/// `sql` (tokenized as `tokens`) with `edits` made in its text; `None` when a token's span
/// does not point into the text.
pub fn apply_to_text(sql: &str, tokens: &[TokenWithSpan], edits: &[Edit]) -> Option<String> {
    let mut out = String::with_capacity(sql.len() + 16 * edits.len());
    let mut from = 0;
    for edit in edits {
        let span = tokens.get(edit.at)?.span;
        let (begin, end) = (offset(sql, span.start)?, offset(sql, span.end)?);
        out.push_str(sql.get(from..begin)?);
        out.push_str(&edit.text);
        from = end;
    }
    out.push_str(sql.get(from..)?);
    Some(out)
}

/// Each query-position `TABLE name`, as `SELECT * FROM name`.
fn table_commands(significant: &[(usize, &TokenWithSpan)]) -> Vec<Edit> {
    let mut at = Vec::new();
    // The first word of the statement being read, and its parenthesis depth.
    let mut first: Option<Keyword> = None;
    let mut depth = 0usize;
    // Whether this PREPARE statement's `AS` was already seen.
    let mut prepared_as = false;
    for (i, (index, t)) in significant.iter().enumerate() {
        let prev = i.checked_sub(1).map(|p| &significant[p].1.token);
        match &t.token {
            Token::SemiColon => {
                first = None;
                depth = 0;
                prepared_as = false;
                continue;
            }
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            _ => {}
        }
        if first.is_none() {
            first = Some(keyword(&t.token).unwrap_or(Keyword::NoKeyword));
        }
        if keyword(&t.token) != Some(Keyword::TABLE) {
            if keyword(&t.token) == Some(Keyword::AS) && depth == 0 {
                // Checked below for the TABLE that follows, then remembered.
                if keyword_is(significant.get(i + 1), Keyword::TABLE) {
                    continue;
                }
                prepared_as = true;
            }
            continue;
        }
        let named = matches!(
            significant.get(i + 1).map(|n| &n.1.token),
            Some(Token::Word(_))
        );
        let starts_query = match prev {
            None | Some(Token::SemiColon | Token::LParen | Token::RParen) => true,
            Some(p) => match keyword(p) {
                Some(
                    Keyword::UNION
                    | Keyword::INTERSECT
                    | Keyword::EXCEPT
                    | Keyword::ALL
                    | Keyword::DISTINCT
                    | Keyword::EXPLAIN,
                ) => true,
                Some(Keyword::ANALYZE | Keyword::VERBOSE) => first == Some(Keyword::EXPLAIN),
                // PREPARE name [(types)] AS TABLE x
                Some(Keyword::AS) => {
                    let first_as = !prepared_as && depth == 0;
                    prepared_as = true;
                    first == Some(Keyword::PREPARE) && first_as
                }
                // DECLARE name CURSOR [WITH HOLD] FOR TABLE x
                Some(Keyword::FOR) => first == Some(Keyword::DECLARE),
                _ => false,
            },
        };
        if named && starts_query {
            at.push(Edit {
                at: *index,
                tokens: vec![
                    Token::make_keyword("SELECT"),
                    Token::Mul,
                    Token::make_keyword("FROM"),
                ],
                text: "SELECT * FROM".to_string(),
            });
        }
    }
    at
}

/// `ALTER VIEW ... RENAME` and `COMMENT ON VIEW` spelled with `TABLE`, and the dollar-quoted
/// text of a `COMMENT ON` (dbt quotes comments so) as a plain literal.
fn views_as_tables(significant: &[(usize, &TokenWithSpan)]) -> Vec<Edit> {
    let mut edits = Vec::new();
    let mut start = 0;
    for (i, (index, t)) in significant.iter().enumerate() {
        if t.token == Token::SemiColon {
            start = i + 1;
            continue;
        }
        // The statement's words before this token: how many, and the first two (read in
        // place, so that a long statement is scanned once).
        let before = i - start;
        let word = |k: usize| significant.get(start + k).and_then(|w| keyword(&w.1.token));
        let comment_on = word(0) == Some(Keyword::COMMENT) && word(1) == Some(Keyword::ON);
        let commenting = before >= 2 && comment_on;
        if let Token::DollarQuotedString(text) = &t.token {
            if commenting {
                edits.push(Edit {
                    at: *index,
                    tokens: vec![Token::SingleQuotedString(text.value.clone())],
                    text: format!("'{}'", text.value.replace('\'', "''")),
                });
            }
            continue;
        }
        if keyword(&t.token) != Some(Keyword::VIEW) {
            continue;
        }
        let renames = || {
            significant[i..]
                .iter()
                .take_while(|w| w.1.token != Token::SemiColon)
                .any(|w| keyword(&w.1.token) == Some(Keyword::RENAME))
        };
        let comment = before == 2 && comment_on;
        let alter = before == 1 && word(0) == Some(Keyword::ALTER) && renames();
        if comment || alter {
            edits.push(Edit::keyword(*index, "TABLE"));
        }
    }
    edits
}

/// `ABORT` where a statement starts, as `ROLLBACK` (the parser lacks the word).
fn aborts(significant: &[(usize, &TokenWithSpan)]) -> Vec<Edit> {
    let mut edits = Vec::new();
    let mut starts = true;
    for (index, t) in significant {
        if starts && keyword(&t.token) == Some(Keyword::ABORT) {
            edits.push(Edit::keyword(*index, "ROLLBACK"));
        }
        starts = t.token == Token::SemiColon;
    }
    edits
}

/// The tokens of `sql`, white space included, as the parser reads them.
pub fn tokens(
    sql: &str,
) -> Result<Vec<TokenWithSpan>, datafusion::sql::sqlparser::tokenizer::TokenizerError> {
    Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize_with_location()
}

/// The keyword of an unquoted word.
fn keyword(t: &Token) -> Option<Keyword> {
    match t {
        Token::Word(w) if w.quote_style.is_none() => Some(w.keyword),
        _ => None,
    }
}

fn keyword_is(t: Option<&(usize, &TokenWithSpan)>, k: Keyword) -> bool {
    t.and_then(|t| keyword(&t.1.token)) == Some(k)
}

/// The byte offset of a (1-based) line and column, counted in characters.
fn offset(sql: &str, at: Location) -> Option<usize> {
    let line = usize::try_from(at.line).ok()?.checked_sub(1)?;
    let column = usize::try_from(at.column).ok()?.checked_sub(1)?;
    let line_start = if line == 0 {
        0
    } else {
        sql.match_indices('\n').nth(line - 1)?.0 + 1
    };
    let rest = sql.get(line_start..)?;
    // The end of the text is a position too (where a last token ends).
    rest.char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(rest.len()))
        .nth(column)
        .map(|i| line_start + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sql` with the edits one kind of them needs, in its text; `None` when it needs none.
    fn edited(sql: &str, kind: fn(&[(usize, &TokenWithSpan)]) -> Vec<Edit>) -> Option<String> {
        let tokens = tokens(sql).ok()?;
        let significant: Vec<(usize, &TokenWithSpan)> = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| !matches!(t.token, Token::Whitespace(_) | Token::EOF))
            .collect();
        let edits = kind(&significant);
        if edits.is_empty() {
            return None;
        }
        apply_to_text(sql, &tokens, &edits)
    }

    fn view_as_table(sql: &str) -> Option<String> {
        edited(sql, views_as_tables)
    }

    fn expand(sql: &str) -> Option<String> {
        edited(sql, table_commands)
    }

    #[test]
    fn views_are_renamed_and_commented_as_tables() {
        assert_eq!(
            view_as_table(r#"alter view "m"."v__dbt_tmp" rename to "v""#).as_deref(),
            Some(r#"alter TABLE "m"."v__dbt_tmp" rename to "v""#)
        );
        assert_eq!(
            view_as_table("comment on view m.v is 'x'; select 'view'").as_deref(),
            Some("comment on TABLE m.v is 'x'; select 'view'")
        );
        assert_eq!(view_as_table("create view v as select 1"), None);
        assert_eq!(
            view_as_table("comment on view \"m\".\"v\" is $c$it's $x$c$;").as_deref(),
            Some("comment on TABLE \"m\".\"v\" is 'it''s $x';")
        );
        assert_eq!(
            view_as_table("comment on column m.t.a is $dbt$a$dbt$").as_deref(),
            Some("comment on column m.t.a is 'a'")
        );
        assert_eq!(view_as_table("select * from pg_views"), None);
    }

    fn ex(sql: &str) -> String {
        expand(sql).unwrap_or_else(|| sql.to_string())
    }

    #[test]
    fn table_commands_become_selects() {
        assert_eq!(ex("TABLE orders"), "SELECT * FROM orders");
        assert_eq!(ex("table s.\"Orders\";"), "SELECT * FROM s.\"Orders\";");
        assert_eq!(
            ex("TABLE a ORDER BY id LIMIT 2; TABLE b"),
            "SELECT * FROM a ORDER BY id LIMIT 2; SELECT * FROM b"
        );
        assert_eq!(ex("EXPLAIN TABLE a"), "EXPLAIN SELECT * FROM a");
        assert_eq!(
            ex("EXPLAIN ANALYZE TABLE a"),
            "EXPLAIN ANALYZE SELECT * FROM a"
        );
        assert_eq!(
            ex("COPY (TABLE a) TO STDOUT"),
            "COPY (SELECT * FROM a) TO STDOUT"
        );
        assert_eq!(ex("PREPARE p AS TABLE a"), "PREPARE p AS SELECT * FROM a");
        assert_eq!(
            ex("DECLARE c CURSOR FOR TABLE a"),
            "DECLARE c CURSOR FOR SELECT * FROM a"
        );
        assert_eq!(
            ex("TABLE a UNION ALL TABLE b"),
            "SELECT * FROM a UNION ALL SELECT * FROM b"
        );
        assert_eq!(
            ex("WITH w AS (TABLE a) TABLE w"),
            "WITH w AS (SELECT * FROM a) SELECT * FROM w"
        );
        assert_eq!(
            ex("/* é */\n  TABLE a -- x"),
            "/* é */\n  SELECT * FROM a -- x"
        );
    }

    #[test]
    fn other_uses_of_the_word_stay() {
        for sql in [
            "DROP TABLE a",
            "CREATE TABLE a (id int)",
            "TRUNCATE TABLE a",
            "LOCK TABLE a",
            "ANALYZE TABLE a",
            "SELECT 'TABLE a'",
            "SELECT 1 AS table FROM a",
            "PREPARE p AS SELECT 1 AS table FROM a",
            "CREATE VIEW v AS TABLE a",
            "SELECT \"table\" FROM a",
            "COMMENT ON TABLE a IS 'x'",
            "GRANT SELECT ON TABLE a TO b",
        ] {
            assert_eq!(ex(sql), sql);
        }
    }
}
