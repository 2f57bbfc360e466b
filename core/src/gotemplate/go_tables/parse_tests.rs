// Test data, not code: the rows of `parseTests` in Go's `src/text/template/parse/parse_test.go`, Go go1.26.6 (tag
// `go1.26.6`, the toolchain rancher/fleet v0.16.1's go.mod names), in Go's order, transcribed
// field by field (no Go code is copied). `result` is what Go's
// `Root.String()` prints (text as `%q`) for a row that parses.
//
// The rows are Go's, under Go's license (BSD-3-Clause), reproduced here as the license asks:
//
// Copyright 2009 The Go Authors.
//
// Redistribution and use in source and binary forms, with or without
// modification, are permitted provided that the following conditions are
// met:
//
//    * Redistributions of source code must retain the above copyright
// notice, this list of conditions and the following disclaimer.
//    * Redistributions in binary form must reproduce the above
// copyright notice, this list of conditions and the following disclaimer
// in the documentation and/or other materials provided with the
// distribution.
//    * Neither the name of Google LLC nor the names of its
// contributors may be used to endorse or promote products derived from
// this software without specific prior written permission.
//
// THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS
// "AS IS" AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT
// LIMITED TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR
// A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT
// OWNER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL,
// SPECIAL, EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT
// LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE,
// DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY
// THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
// (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
// OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

use super::ParseRow;

/// Go's `parseTests`.
pub const PARSE_TESTS: &[ParseRow] = &[
    ParseRow {
        name: "empty",
        input: "",
        ok: true,
        result: "",
    },
    ParseRow {
        name: "comment",
        input: "{{/*\n\n\n*/}}",
        ok: true,
        result: "",
    },
    ParseRow {
        name: "spaces",
        input: " \t\n",
        ok: true,
        result: "\" \\t\\n\"",
    },
    ParseRow {
        name: "text",
        input: "some text",
        ok: true,
        result: "\"some text\"",
    },
    ParseRow {
        name: "emptyAction",
        input: "{{}}",
        ok: false,
        result: "{{}}",
    },
    ParseRow {
        name: "field",
        input: "{{.X}}",
        ok: true,
        result: "{{.X}}",
    },
    ParseRow {
        name: "simple command",
        input: "{{printf}}",
        ok: true,
        result: "{{printf}}",
    },
    ParseRow {
        name: "$ invocation",
        input: "{{$}}",
        ok: true,
        result: "{{$}}",
    },
    ParseRow {
        name: "variable invocation",
        input: "{{with $x := 3}}{{$x 23}}{{end}}",
        ok: true,
        result: "{{with $x := 3}}{{$x 23}}{{end}}",
    },
    ParseRow {
        name: "variable with fields",
        input: "{{$.I}}",
        ok: true,
        result: "{{$.I}}",
    },
    ParseRow {
        name: "multi-word command",
        input: "{{printf `%d` 23}}",
        ok: true,
        result: "{{printf `%d` 23}}",
    },
    ParseRow {
        name: "pipeline",
        input: "{{.X|.Y}}",
        ok: true,
        result: "{{.X | .Y}}",
    },
    ParseRow {
        name: "pipeline with decl",
        input: "{{$x := .X|.Y}}",
        ok: true,
        result: "{{$x := .X | .Y}}",
    },
    ParseRow {
        name: "nested pipeline",
        input: "{{.X (.Y .Z) (.A | .B .C) (.E)}}",
        ok: true,
        result: "{{.X (.Y .Z) (.A | .B .C) (.E)}}",
    },
    ParseRow {
        name: "field applied to parentheses",
        input: "{{(.Y .Z).Field}}",
        ok: true,
        result: "{{(.Y .Z).Field}}",
    },
    ParseRow {
        name: "simple if",
        input: "{{if .X}}hello{{end}}",
        ok: true,
        result: "{{if .X}}\"hello\"{{end}}",
    },
    ParseRow {
        name: "if with else",
        input: "{{if .X}}true{{else}}false{{end}}",
        ok: true,
        result: "{{if .X}}\"true\"{{else}}\"false\"{{end}}",
    },
    ParseRow {
        name: "if with else if",
        input: "{{if .X}}true{{else if .Y}}false{{end}}",
        ok: true,
        result: "{{if .X}}\"true\"{{else}}{{if .Y}}\"false\"{{end}}{{end}}",
    },
    ParseRow {
        name: "if else chain",
        input: "+{{if .X}}X{{else if .Y}}Y{{else if .Z}}Z{{end}}+",
        ok: true,
        result: "\"+\"{{if .X}}\"X\"{{else}}{{if .Y}}\"Y\"{{else}}{{if .Z}}\"Z\"{{end}}{{end}}{{end}}\"+\"",
    },
    ParseRow {
        name: "simple range",
        input: "{{range .X}}hello{{end}}",
        ok: true,
        result: "{{range .X}}\"hello\"{{end}}",
    },
    ParseRow {
        name: "chained field range",
        input: "{{range .X.Y.Z}}hello{{end}}",
        ok: true,
        result: "{{range .X.Y.Z}}\"hello\"{{end}}",
    },
    ParseRow {
        name: "nested range",
        input: "{{range .X}}hello{{range .Y}}goodbye{{end}}{{end}}",
        ok: true,
        result: "{{range .X}}\"hello\"{{range .Y}}\"goodbye\"{{end}}{{end}}",
    },
    ParseRow {
        name: "range with else",
        input: "{{range .X}}true{{else}}false{{end}}",
        ok: true,
        result: "{{range .X}}\"true\"{{else}}\"false\"{{end}}",
    },
    ParseRow {
        name: "range over pipeline",
        input: "{{range .X|.M}}true{{else}}false{{end}}",
        ok: true,
        result: "{{range .X | .M}}\"true\"{{else}}\"false\"{{end}}",
    },
    ParseRow {
        name: "range []int",
        input: "{{range .SI}}{{.}}{{end}}",
        ok: true,
        result: "{{range .SI}}{{.}}{{end}}",
    },
    ParseRow {
        name: "range 1 var",
        input: "{{range $x := .SI}}{{.}}{{end}}",
        ok: true,
        result: "{{range $x := .SI}}{{.}}{{end}}",
    },
    ParseRow {
        name: "range 2 vars",
        input: "{{range $x, $y := .SI}}{{.}}{{end}}",
        ok: true,
        result: "{{range $x, $y := .SI}}{{.}}{{end}}",
    },
    ParseRow {
        name: "range with break",
        input: "{{range .SI}}{{.}}{{break}}{{end}}",
        ok: true,
        result: "{{range .SI}}{{.}}{{break}}{{end}}",
    },
    ParseRow {
        name: "range with continue",
        input: "{{range .SI}}{{.}}{{continue}}{{end}}",
        ok: true,
        result: "{{range .SI}}{{.}}{{continue}}{{end}}",
    },
    ParseRow {
        name: "constants",
        input: "{{range .SI 1 -3.2i true false 'a' nil}}{{end}}",
        ok: true,
        result: "{{range .SI 1 -3.2i true false 'a' nil}}{{end}}",
    },
    ParseRow {
        name: "template",
        input: "{{template `x`}}",
        ok: true,
        result: "{{template \"x\"}}",
    },
    ParseRow {
        name: "template with arg",
        input: "{{template `x` .Y}}",
        ok: true,
        result: "{{template \"x\" .Y}}",
    },
    ParseRow {
        name: "with",
        input: "{{with .X}}hello{{end}}",
        ok: true,
        result: "{{with .X}}\"hello\"{{end}}",
    },
    ParseRow {
        name: "with with else",
        input: "{{with .X}}hello{{else}}goodbye{{end}}",
        ok: true,
        result: "{{with .X}}\"hello\"{{else}}\"goodbye\"{{end}}",
    },
    ParseRow {
        name: "with with else with",
        input: "{{with .X}}hello{{else with .Y}}goodbye{{end}}",
        ok: true,
        result: "{{with .X}}\"hello\"{{else}}{{with .Y}}\"goodbye\"{{end}}{{end}}",
    },
    ParseRow {
        name: "with else chain",
        input: "{{with .X}}X{{else with .Y}}Y{{else with .Z}}Z{{end}}",
        ok: true,
        result: "{{with .X}}\"X\"{{else}}{{with .Y}}\"Y\"{{else}}{{with .Z}}\"Z\"{{end}}{{end}}{{end}}",
    },
    ParseRow {
        name: "trim left",
        input: "x \r\n\t{{- 3}}",
        ok: true,
        result: "\"x\"{{3}}",
    },
    ParseRow {
        name: "trim right",
        input: "{{3 -}}\n\n\ty",
        ok: true,
        result: "{{3}}\"y\"",
    },
    ParseRow {
        name: "trim left and right",
        input: "x \r\n\t{{- 3 -}}\n\n\ty",
        ok: true,
        result: "\"x\"{{3}}\"y\"",
    },
    ParseRow {
        name: "trim with extra spaces",
        input: "x\n{{-  3   -}}\ny",
        ok: true,
        result: "\"x\"{{3}}\"y\"",
    },
    ParseRow {
        name: "comment trim left",
        input: "x \r\n\t{{- /* hi */}}",
        ok: true,
        result: "\"x\"",
    },
    ParseRow {
        name: "comment trim right",
        input: "{{/* hi */ -}}\n\n\ty",
        ok: true,
        result: "\"y\"",
    },
    ParseRow {
        name: "comment trim left and right",
        input: "x \r\n\t{{- /* */ -}}\n\n\ty",
        ok: true,
        result: "\"x\"\"y\"",
    },
    ParseRow {
        name: "block definition",
        input: "{{block \"foo\" .}}hello{{end}}",
        ok: true,
        result: "{{template \"foo\" .}}",
    },
    ParseRow {
        name: "newline in assignment",
        input: "{{ $x \n := \n 1 \n }}",
        ok: true,
        result: "{{$x := 1}}",
    },
    ParseRow {
        name: "newline in empty action",
        input: "{{\n}}",
        ok: false,
        result: "{{\n}}",
    },
    ParseRow {
        name: "newline in pipeline",
        input: "{{\n\"x\"\n|\nprintf\n}}",
        ok: true,
        result: "{{\"x\" | printf}}",
    },
    ParseRow {
        name: "newline in comment",
        input: "{{/*\nhello\n*/}}",
        ok: true,
        result: "",
    },
    ParseRow {
        name: "newline in comment",
        input: "{{-\n/*\nhello\n*/\n-}}",
        ok: true,
        result: "",
    },
    ParseRow {
        name: "spaces around continue",
        input: "{{range .SI}}{{.}}{{ continue }}{{end}}",
        ok: true,
        result: "{{range .SI}}{{.}}{{continue}}{{end}}",
    },
    ParseRow {
        name: "spaces around break",
        input: "{{range .SI}}{{.}}{{ break }}{{end}}",
        ok: true,
        result: "{{range .SI}}{{.}}{{break}}{{end}}",
    },
    ParseRow {
        name: "unclosed action",
        input: "hello{{range",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "unmatched end",
        input: "{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "unmatched else",
        input: "{{else}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "unmatched else after if",
        input: "{{if .X}}hello{{end}}{{else}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "multiple else",
        input: "{{if .X}}1{{else}}2{{else}}3{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "missing end",
        input: "hello{{range .x}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "missing end after else",
        input: "hello{{range .x}}{{else}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "undefined function",
        input: "hello{{undefined}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "undefined variable",
        input: "{{$x}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "variable undefined after end",
        input: "{{with $x := 4}}{{end}}{{$x}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "variable undefined in template",
        input: "{{template $v}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "declare with field",
        input: "{{with $x.Y := 4}}{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "template with field ref",
        input: "{{template .X}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "template with var",
        input: "{{template $v}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "invalid punctuation",
        input: "{{printf 3, 4}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "multidecl outside range",
        input: "{{with $v, $u := 3}}{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "too many decls in range",
        input: "{{range $u, $v, $w := 3}}{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "dot applied to parentheses",
        input: "{{printf (printf .).}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "adjacent args",
        input: "{{printf 3`x`}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "adjacent args with .",
        input: "{{printf `x`.}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "extra end after if",
        input: "{{if .X}}a{{else if .Y}}b{{end}}{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "break outside range",
        input: "{{range .}}{{end}} {{break}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "continue outside range",
        input: "{{range .}}{{end}} {{continue}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "break in range else",
        input: "{{range .}}{{else}}{{break}}{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "continue in range else",
        input: "{{range .}}{{else}}{{continue}}{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "bug0a",
        input: "{{$x := 0}}{{$x}}",
        ok: true,
        result: "{{$x := 0}}{{$x}}",
    },
    ParseRow {
        name: "bug0b",
        input: "{{$x += 1}}{{$x}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "bug0c",
        input: "{{$x ! 2}}{{$x}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "bug0d",
        input: "{{$x % 3}}{{$x}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "bug0e",
        input: "{{range $x := $y := 3}}{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "bug1a",
        input: "{{$x:=.}}{{$x!2}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "bug1b",
        input: "{{$x:=.}}{{$x+2}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "bug1c",
        input: "{{$x:=.}}{{$x +2}}",
        ok: true,
        result: "{{$x := .}}{{$x +2}}",
    },
    ParseRow {
        name: "bug2a",
        input: "{{range $x := 0}}{{$x}}{{end}}",
        ok: true,
        result: "{{range $x := 0}}{{$x}}{{end}}",
    },
    ParseRow {
        name: "bug2b",
        input: "{{range $x = 0}}{{$x}}{{end}}",
        ok: true,
        result: "{{range $x = 0}}{{$x}}{{end}}",
    },
    ParseRow {
        name: "dot after integer",
        input: "{{1.E}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "dot after float",
        input: "{{0.1.E}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "dot after boolean",
        input: "{{true.E}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "dot after char",
        input: "{{'a'.any}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "dot after string",
        input: "{{\"hello\".guys}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "dot after dot",
        input: "{{..E}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "dot after nil",
        input: "{{nil.E}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "wrong pipeline dot",
        input: "{{12|.}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "wrong pipeline number",
        input: "{{.|12|printf}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "wrong pipeline string",
        input: "{{.|printf|\"error\"}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "wrong pipeline char",
        input: "{{12|printf|'e'}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "wrong pipeline boolean",
        input: "{{.|true}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "wrong pipeline nil",
        input: "{{'c'|nil}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "empty pipeline",
        input: "{{printf \"%d\" ( ) }}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "block definition",
        input: "{{block \"foo\"}}hello{{end}}",
        ok: false,
        result: "",
    },
    ParseRow {
        name: "paren nesting normal",
        input: "{{ (( 1 )) }}",
        ok: true,
        result: "{{((1))}}",
    },
    ParseRow {
        name: "paren nesting at limit",
        input: "{{ ((( 1 ))) }}",
        ok: true,
        result: "{{(((1)))}}",
    },
    ParseRow {
        name: "paren nesting exceeds limit",
        input: "{{ (((( 1 )))) }}",
        ok: false,
        result: "template: test:1: max expression depth exceeded",
    },
    ParseRow {
        name: "paren nesting in pipeline",
        input: "{{ ((( 1 ))) | printf }}",
        ok: true,
        result: "{{(((1))) | printf}}",
    },
    ParseRow {
        name: "paren nesting in pipeline exceeds limit",
        input: "{{ (((( 1 )))) | printf }}",
        ok: false,
        result: "template: test:1: max expression depth exceeded",
    },
    ParseRow {
        name: "paren nesting with other constructs",
        input: "{{ if ((( true ))) }}YES{{ end }}",
        ok: true,
        result: "{{if (((true)))}}\"YES\"{{end}}",
    },
    ParseRow {
        name: "paren nesting with other constructs exceeds limit",
        input: "{{ if (((( true )))) }}YES{{ end }}",
        ok: false,
        result: "template: test:1: max expression depth exceeded",
    },
];
