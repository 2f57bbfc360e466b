//! The function names a Fleet values template may call: Go's `text/template` builtins and
//! Sprig's `TxtFuncMap()` (Masterminds/sprig v3 `functions.go` `genericMap`, read from the
//! stored copy at commit 003591c; Fleet v0.16.1 pins sprig v3.3.0), minus what Fleet's
//! `tplFuncMap` deletes (`env`, `expandenv`, `getHostByName`; `include` and `tpl` are Helm's,
//! never Sprig's, so deleting them changes nothing). Go refuses a call of any other name at
//! parse time ("function %q not defined").

/// Go's builtins (`text/template/funcs.go` `builtins`).
const BUILTINS: &[&str] = &[
    "and", "call", "html", "index", "slice", "js", "len", "not", "or", "print", "printf",
    "println", "urlquery", "eq", "ge", "gt", "le", "lt", "ne",
];

/// Sprig's `genericMap` keys without the ones Fleet deletes.
const SPRIG: &[&str] = &[
    "hello", "ago", "date", "date_in_zone", "date_modify", "dateInZone", "dateModify",
    "duration", "durationRound", "htmlDate", "htmlDateInZone", "must_date_modify",
    "mustDateModify", "mustToDate", "now", "toDate", "unixEpoch", "abbrev", "abbrevboth",
    "trunc", "trim", "upper", "lower", "title", "untitle", "substr", "repeat", "trimall",
    "trimAll", "trimSuffix", "trimPrefix", "nospace", "initials", "randAlphaNum", "randAlpha",
    "randAscii", "randNumeric", "randSeededNumeric", "swapcase", "shuffle", "snakecase",
    "camelcase", "kebabcase", "wrap", "wrapWith", "contains", "hasPrefix", "hasSuffix",
    "quote", "squote", "cat", "indent", "nindent", "replace", "plural", "sha1sum", "sha256sum",
    "adler32sum", "toString", "atoi", "int64", "int", "float64", "seq", "toDecimal", "split",
    "splitList", "splitn", "toStrings", "until", "untilStep", "add1", "add", "sub", "div",
    "mod", "mul", "randInt", "add1f", "addf", "subf", "divf", "mulf", "biggest", "max", "min",
    "maxf", "minf", "ceil", "floor", "round", "join", "sortAlpha", "default", "empty",
    "coalesce", "all", "any", "compact", "mustCompact", "fromJson", "toJson", "toPrettyJson",
    "toRawJson", "mustFromJson", "mustToJson", "mustToPrettyJson", "mustToRawJson", "ternary",
    "deepCopy", "mustDeepCopy", "typeOf", "typeIs", "typeIsLike", "kindOf", "kindIs",
    "deepEqual", "base", "dir", "clean", "ext", "isAbs", "osBase", "osClean", "osDir", "osExt",
    "osIsAbs", "b64enc", "b64dec", "b32enc", "b32dec", "tuple", "list", "dict", "get", "set",
    "unset", "hasKey", "pluck", "keys", "pick", "omit", "merge", "mergeOverwrite", "mustMerge",
    "mustMergeOverwrite", "values", "append", "push", "mustAppend", "mustPush", "prepend",
    "mustPrepend", "first", "mustFirst", "rest", "mustRest", "last", "mustLast", "initial",
    "mustInitial", "reverse", "mustReverse", "uniq", "mustUniq", "without", "mustWithout",
    "has", "mustHas", "slice", "mustSlice", "concat", "dig", "chunk", "mustChunk", "bcrypt",
    "htpasswd", "genPrivateKey", "derivePassword", "buildCustomCert", "genCA", "genCAWithKey",
    "genSelfSignedCert", "genSelfSignedCertWithKey", "genSignedCert", "genSignedCertWithKey",
    "encryptAES", "decryptAES", "randBytes", "uuidv4", "semver", "semverCompare", "fail",
    "regexMatch", "mustRegexMatch", "regexFindAll", "mustRegexFindAll", "regexFind",
    "mustRegexFind", "regexReplaceAll", "mustRegexReplaceAll", "regexReplaceAllLiteral",
    "mustRegexReplaceAllLiteral", "regexSplit", "mustRegexSplit", "regexQuoteMeta", "urlParse",
    "urlJoin",
];

/// Whether a Fleet values template may call `name`.
pub fn is_defined(name: &str) -> bool {
    BUILTINS.contains(&name) || SPRIG.contains(&name)
}
