// Package layers holds one test: the module's import rules. The layers
// point down (the contract, the kit, the providers with their internal
// helpers, the server and client, the commands), and the rules table below
// says so edge by edge, so that an import running back up fails CI with the
// file and line that made it.
package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A rule is what the packages it covers may import.
//
// Packages are named relative to the module: "." is the root package,
// "./kit" one package, "./provider/..." provider and every package below
// it. An import is also matched by a class: "std" (the standard library),
// "third-party" (another module), "harness" (a test harness of this
// module: see isHarness); any other name is a standard library package
// ("testing").
type rule struct {
	from string
	// tests: the rule covers the packages' _test.go files too, not only
	// the code a program links.
	tests bool
	// exceptHarnesses: the rule does not cover test harnesses.
	exceptHarnesses bool
	// only, when set, is everything the packages may import; never is
	// what they may not.
	only, never []string
	// unless exempts an import the rule would refuse (module-relative
	// paths, "" the root).
	unless func(from, to string) bool
	why    string
}

var rules = []rule{
	{from: ".", only: []string{"std"},
		why: "the contract depends on nothing but the standard library"},
	{from: "./kit", only: []string{"std", ".", "golang.org/x/sync/singleflight"},
		why: "the kit builds on the contract alone (and x/sync's singleflight, for adopting a shared session once)"},
	{from: "./api", only: []string{"std", "."},
		why: "the wire format is the contract's types on the wire"},
	{from: "./sandboxtest", only: []string{"std", "."},
		why: "the conformance suite tests any provider through the contract alone"},
	{from: "./ledger", only: []string{"std", "third-party", ".", "./kit"},
		why: "the durable ledger is the kit's Ledger on a database, nothing more"},
	{from: "./internal/...", tests: true,
		never: []string{"./provider/...", "./server", "./client", "./api", "./ledger", "./sandboxtest", "./mcpserver"},
		why:   "the internal helpers sit below the providers: they know no provider, no wire, no ledger, no suite"},
	{from: "./provider/...", tests: true, never: []string{"./server", "./client", "./api", "./mcpserver"},
		why: "a provider is served; it does not serve"},
	{from: "./provider/...", tests: true, never: []string{"./provider/..."}, unless: sameProvider,
		why: "a provider, its tests and its harness do not build on another provider"},
	{from: "./server", only: []string{"std", "third-party", ".", "./api"},
		why: "the daemon serves any sandbox.Sandbox: it knows no provider, no kit, no client"},
	{from: "./client", only: []string{"std", "third-party", ".", "./api"},
		why: "the client speaks the wire format: it knows no provider, no kit, no server"},
	{from: "./mcpserver", only: []string{"std", "third-party", "."},
		why: "the MCP server serves any sandbox.Sandbox as tools: it knows no provider, no kit, no wire, no daemon"},
	{from: "./...", tests: true, never: []string{"./cmd/...", "./bench/..."},
		why: "the commands and the benchmarks are leaves: nothing builds on them"},
	{from: "./...", exceptHarnesses: true, never: []string{"harness"},
		why: "a program or library never links a test harness"},
	{from: "./...", exceptHarnesses: true, never: []string{"testing"},
		why: "only tests and test harnesses (packages named ...test) import testing"},
}

// sameProvider: from and to are in the same provider's tree
// (provider/host and provider/host/hosttest).
func sameProvider(from, to string) bool {
	top := func(p string) string {
		parts := strings.SplitN(p, "/", 3)
		return strings.Join(parts[:min(2, len(parts))], "/")
	}
	return top(from) == top(to)
}

// isHarness: the package (module-relative) is a test harness, named ...test
// as net/http/httptest is, or lies below one (its commands, as
// internal/imagestore/imagestoretest/cmd/mkbusybox).
func isHarness(rel string) bool {
	for elem := range strings.SplitSeq(rel, "/") {
		if strings.HasSuffix(elem, "test") {
			return true
		}
	}
	return false
}

// testedBy: rel is a harness and to the package it tests, the directory
// above it (sandboxtest tests the root, the contract).
func testedBy(to, rel string) bool {
	dir, last := path.Split(rel)
	return strings.HasSuffix(last, "test") && to == strings.TrimSuffix(dir, "/")
}

// listed is what `go list -json` says of a package, as far as the rules
// need it.
type listed struct {
	ImportPath, Dir                   string
	GoFiles, CgoFiles, IgnoredGoFiles []string
	TestGoFiles, XTestGoFiles         []string
	Module                            *struct{ Path string }
}

// edge is one import: a file of package from (module-relative) imports to
// (an import path).
type edge struct {
	from, to string
	pos      string // file:line, relative to the module's root
	test     bool   // the file is a _test.go file
}

// TestImportRules checks every import of every Go file of the module
// against every rule that covers it, and names each import a rule refuses.
func TestImportRules(t *testing.T) {
	root := moduleRoot(t)
	module, pkgs := list(t, root)
	var edges []edge
	for _, p := range pkgs {
		edges = append(edges, imports(t, root, module, p)...)
	}
	rel := func(importPath string) (string, bool) {
		if importPath == module {
			return "", true
		}
		r, ok := strings.CutPrefix(importPath, module+"/")
		return r, ok
	}
	matches := func(pattern, importPath string) bool {
		r, inModule := rel(importPath)
		switch pattern {
		case "std":
			return isStd(importPath)
		case "third-party":
			return !isStd(importPath) && !inModule
		case "harness":
			return inModule && isHarness(r)
		}
		if !strings.HasPrefix(pattern, ".") {
			return importPath == pattern
		}
		return inModule && covers(pattern, r)
	}
	covered := map[int]bool{}
	for _, e := range edges {
		to, inModule := rel(e.to)
		if inModule && (to == e.from || testedBy(to, e.from)) {
			continue // a package's own tests, and a harness importing what it tests
		}
		for i, r := range rules {
			if !covers(r.from, e.from) || (e.test && !r.tests) || (r.exceptHarnesses && isHarness(e.from)) {
				continue
			}
			covered[i] = true
			if r.unless != nil && inModule && r.unless(e.from, to) {
				continue
			}
			allowed := r.only == nil
			for _, pat := range r.only {
				allowed = allowed || matches(pat, e.to)
			}
			for _, pat := range r.never {
				allowed = allowed && !matches(pat, e.to)
			}
			if !allowed {
				t.Errorf("%s: %s imports %s: %s (rule %s)", e.pos, show(module, e.from), e.to, r.why, r)
			}
		}
	}
	// A rule that covers no import is stale (a package renamed or moved
	// away from under it), and would pass whatever happens.
	for i, r := range rules {
		if !covered[i] {
			t.Errorf("rule %s covers no import in the module: fix or remove it", r)
		}
	}
}

func (r rule) String() string {
	var b strings.Builder
	b.WriteString(strconv.Quote(r.from))
	if r.tests {
		b.WriteString(" with tests")
	}
	if r.exceptHarnesses {
		b.WriteString(" except harnesses")
	}
	if r.only != nil {
		fmt.Fprintf(&b, " only %v", r.only)
	}
	if r.never != nil {
		fmt.Fprintf(&b, " never %v", r.never)
	}
	return b.String()
}

// covers: the package pattern ("." the root, "./x", "./x/...") covers the
// module-relative package rel ("" the root).
func covers(pattern, rel string) bool {
	switch pattern {
	case ".":
		return rel == ""
	case "./...":
		return true
	}
	p := strings.TrimPrefix(pattern, "./")
	if dir, ok := strings.CutSuffix(p, "/..."); ok {
		return rel == dir || strings.HasPrefix(rel, dir+"/")
	}
	return rel == p
}

// isStd: the import path is the standard library's, whose first element
// has no dot (cmd/go's own test), or cgo's "C".
func isStd(importPath string) bool {
	first, _, _ := strings.Cut(importPath, "/")
	return !strings.Contains(first, ".")
}

func show(module, rel string) string {
	if rel == "" {
		return module
	}
	return module + "/" + rel
}

// moduleRoot is the directory of the go.mod above this test's directory.
func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// list runs `go list` once over the module: its path and its packages.
func list(t *testing.T, root string) (string, []listed) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the import rules need the go command (go test puts it on PATH): %v", err)
	}
	cmd := exec.Command(goCmd, "list", "-json=ImportPath,Dir,GoFiles,CgoFiles,IgnoredGoFiles,TestGoFiles,XTestGoFiles,Module", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listed
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list's output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 || pkgs[0].Module == nil {
		t.Fatalf("go list ./... in %s listed no package of a module", root)
	}
	return pkgs[0].Module.Path, pkgs
}

// imports are the imports of every Go file of package p, whatever its
// build constraints (the files of the crash tag and of other systems
// too): the rules hold for every build.
func imports(t *testing.T, root, module string, p listed) []edge {
	rel, _ := strings.CutPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
	var edges []edge
	fset := token.NewFileSet()
	for _, files := range [][]string{p.GoFiles, p.CgoFiles, p.IgnoredGoFiles, p.TestGoFiles, p.XTestGoFiles} {
		for _, name := range files {
			file := filepath.Join(p.Dir, name)
			f, err := parser.ParseFile(fset, file, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			pos, err := filepath.Rel(root, file)
			if err != nil {
				t.Fatal(err)
			}
			for _, spec := range f.Imports {
				to, err := strconv.Unquote(spec.Path.Value)
				if err != nil {
					t.Fatalf("%s: %v", pos, err)
				}
				edges = append(edges, edge{
					from: rel,
					to:   to,
					pos:  fmt.Sprintf("%s:%d", pos, fset.Position(spec.Pos()).Line),
					test: strings.HasSuffix(name, "_test.go"),
				})
			}
		}
	}
	return edges
}
