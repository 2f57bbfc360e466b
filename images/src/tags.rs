//! Which tags are mutable: `latest` (and no tag, which means `latest`) always, plus the `--mutable-tags`
//! globs (`*` any run of characters, `?` one character, everything else literal), e.g. `main`, `dev-*`.

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MutableTags {
    patterns: Vec<String>,
}

impl MutableTags {
    pub fn new(patterns: &[String]) -> MutableTags {
        MutableTags {
            patterns: patterns
                .iter()
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect(),
        }
    }

    pub fn is_mutable(&self, tag: &str) -> bool {
        tag == crate::reference::DEFAULT_TAG
            || self
                .patterns
                .iter()
                .any(|p| glob(p.as_bytes(), tag.as_bytes()))
    }
}

/// Iterative glob match with single-star backtracking: linear in practice, never exponential.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_is_always_mutable() {
        let none = MutableTags::default();
        assert!(none.is_mutable("latest"));
        assert!(
            !none.is_mutable("main") && !none.is_mutable("1.2.3") && !none.is_mutable("Latest")
        );
    }

    #[test]
    fn globs() {
        let tags = MutableTags::new(&["main".into(), "dev-*".into(), " ".into(), "rc?-*-x".into()]);
        for yes in [
            "main",
            "dev-",
            "dev-feature-1",
            "rc1-a-x",
            "rc2--x",
            "rc3-a-b-x",
        ] {
            assert!(tags.is_mutable(yes), "{yes}");
        }
        for no in [
            "mainline", "xmain", "dev", "rc-a-x", "rc12-a-x", "rc1-a-xy", "",
        ] {
            assert!(!tags.is_mutable(no), "{no}");
        }
        assert!(MutableTags::new(&["*".into()]).is_mutable("anything"));
        assert!(glob(b"a*b*c", b"aXXbYYbc") && !glob(b"a*b*c", b"aXXbYY"));
    }

    proptest::proptest! {
        #[test]
        fn a_literal_pattern_matches_only_itself(p in "[a-z0-9.-]{1,12}", t in "[a-z0-9.-]{0,12}") {
            proptest::prop_assert_eq!(glob(p.as_bytes(), t.as_bytes()), p == t);
        }

        #[test]
        fn star_suffix_is_prefix_match(p in "[a-z]{0,6}", t in "[a-z]{0,10}") {
            let pattern = format!("{p}*");
            proptest::prop_assert_eq!(glob(pattern.as_bytes(), t.as_bytes()), t.starts_with(&p));
        }
    }
}
