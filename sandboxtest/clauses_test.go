package sandboxtest

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var updateClauses = flag.Bool("update-clauses", false, "rewrite CLAUSES.md from the suite's source")

// clausesFile lists every clause of the suite with what it proves: the doc
// comment of the function that runs it.
const clausesFile = "CLAUSES.md"

// TestClausesDoc checks that CLAUSES.md is the list the suite's source
// makes, so a provider author reading it sees every subtest and what it
// proves; `go test ./sandboxtest -run TestClausesDoc -update-clauses`
// writes it anew.
func TestClausesDoc(t *testing.T) {
	want, err := clausesDoc(".")
	if err != nil {
		t.Fatal(err)
	}
	if *updateClauses {
		if err := os.WriteFile(clausesFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(clausesFile)
	if err != nil {
		t.Fatalf("%v: write it with go test ./sandboxtest -run TestClausesDoc -update-clauses", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not the list the suite's source makes: write it anew with go test ./sandboxtest -run TestClausesDoc -update-clauses", clausesFile)
	}
}

// clausesDoc reads the suite's source in dir: the groups Run makes (name
// and the method listing its clauses), each group's clauses (name and the
// method running it) and each method's doc comment.
func clausesDoc(dir string) ([]byte, error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	docs := map[string]string{}       // method -> doc
	lists := map[string][][2]string{} // method -> [clause name, method]
	var groups [][2]string            // [group name, method]
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			docs[fd.Name.Name] = strings.Join(strings.Fields(fd.Doc.Text()), " ")
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				cl, ok := n.(*ast.CompositeLit)
				if !ok || len(cl.Elts) != 2 {
					return true
				}
				lit, ok := cl.Elts[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				label, _ := strconv.Unquote(lit.Value)
				switch e := cl.Elts[1].(type) {
				case *ast.SelectorExpr: // {"Clause", s.testClause}
					if strings.HasSuffix(fd.Name.Name, "Clauses") {
						lists[fd.Name.Name] = append(lists[fd.Name.Name], [2]string{label, e.Sel.Name})
					}
				case *ast.CallExpr: // {"Group", s.groupClauses()}
					if sel, ok := e.Fun.(*ast.SelectorExpr); ok && strings.HasSuffix(sel.Sel.Name, "Clauses") {
						groups = append(groups, [2]string{label, sel.Sel.Name})
					}
				}
				return true
			})
		}
	}
	if len(groups) == 0 {
		return nil, fmt.Errorf("no clause groups found in %s", dir)
	}
	var b bytes.Buffer
	b.WriteString("# The clauses of the conformance suite\n\n")
	b.WriteString("Every subtest `sandboxtest.Run` makes, as `go test -run 'TestConformance/GROUP/CLAUSE'` selects it, and what it proves.\n")
	b.WriteString("Made from the suite's source by `go test ./sandboxtest -run TestClausesDoc -update-clauses`; a test fails when it is out of date.\n")
	for _, g := range groups {
		fmt.Fprintf(&b, "\n## %s\n\n| Clause | What it proves |\n|---|---|\n", g[0])
		clauses := lists[g[1]]
		if len(clauses) == 0 {
			return nil, fmt.Errorf("group %s: no clauses found in %s", g[0], g[1])
		}
		for _, c := range clauses {
			doc := docs[c[1]]
			if doc == "" {
				return nil, fmt.Errorf("clause %s/%s: its method %s has no doc comment saying what it proves", g[0], c[0], c[1])
			}
			fmt.Fprintf(&b, "| `%s/%s` | %s |\n", g[0], c[0], strings.ReplaceAll(doc, "|", `\|`))
		}
	}
	return b.Bytes(), nil
}
