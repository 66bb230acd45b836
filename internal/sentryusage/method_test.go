package sentryusage

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyEventMethod: the package's code names one urpc method, in the
// Method constant, and builds every request from requestPrefix: no string
// literal elsewhere looks like a method ("Type.Method") of runsc's
// control server, and no function has a parameter called method. With
// FuzzEncodeRequest (every request decodes to Method) and the fake sentry
// (which fails a test on any other method), no other method can be sent.
func TestOnlyEventMethod(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var methodConsts int
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if id.Name == "Method" && i < len(n.Values) {
						lit, ok := n.Values[i].(*ast.BasicLit)
						if !ok || lit.Value != strconv.Quote("containerManager.Event") {
							t.Errorf("%s: Method is not the literal containerManager.Event", fset.Position(id.Pos()))
						}
						methodConsts++
						return false
					}
				}
			case *ast.BasicLit:
				if n.Kind != token.STRING {
					return true
				}
				s, _ := strconv.Unquote(n.Value)
				for _, mgr := range []string{"containerManager.", "Lifecycle.", "Proc.", "State.", "Logging.", "Profile.", "Debug.", "Usage.", "Metrics.", "CgroupControl.", "Fs.", "Events."} {
					if strings.Contains(s, mgr) {
						t.Errorf("%s: string %s names a control-server method", fset.Position(n.Pos()), n.Value)
					}
				}
			case *ast.Field:
				for _, id := range n.Names {
					if strings.EqualFold(id.Name, "method") {
						t.Errorf("%s: a parameter or field called %s", fset.Position(id.Pos()), id.Name)
					}
				}
			}
			return true
		})
	}
	if methodConsts != 1 {
		t.Errorf("%d Method constants, want 1", methodConsts)
	}
	if !strings.HasPrefix(string(encodeRequest(DialectContainerID, "a")), `{"method":"containerManager.Event","arg":`) {
		t.Errorf("requestPrefix is not Method's")
	}
}
