package router

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/fastroute/fastroute/"

// layers is the README tour's order: a package may import only packages of
// its own layer or below. The longest matching prefix names a package's
// layer.
var layers = map[string]int{
	"pickers": 1, "affinity": 1, "lora": 1, "telemetry": 1, "dataplane/metrics": 1, "dataplane/apikeys": 1, "dataplane/aliases": 1, "dataplane/mirrors": 1, "dataplane/tracing": 1, "internal/loopback": 1, "internal/fielderr": 1, "internal/otlpsink": 1, "internal/tlsfiles": 1, "internal/fakedns": 1, "internal/every": 1, "internal/rawsock": 1, "internal/syncbuf": 1, "internal/coloop": 1, "internal/dialer": 1, "internal/memlimit": 1, "internal/filetree": 1, "internal/testpki": 1, "internal/workerclient": 1, "internal/bearer": 1, "internal/logformat": 1,
	"dataplane":       2,
	"dataplane/loops": 3, "discovery": 3,
	"dataplane/http":   4,
	"dataplane/config": 5, "dataplane/router": 5,
	"cmd": 6, "bench": 6, "fuzz": 6,
}

func layerOf(t *testing.T, pkg string) int {
	best, layer := "", 0
	for prefix, l := range layers {
		if (pkg == prefix || strings.HasPrefix(pkg, prefix+"/")) && len(prefix) > len(best) {
			best, layer = prefix, l
		}
	}
	require.NotZero(t, layer, "package %s has no layer: add it to the tour and to this table", pkg)
	return layer
}

// TestImportsOnlyPointDown reads every non-test Go file of the module and
// fails on an import of a package from a higher layer.
func TestImportsOnlyPointDown(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	fset := token.NewFileSet()
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			dep, ok := strings.CutPrefix(p, module)
			if !ok {
				continue
			}
			if layerOf(t, dep) > layerOf(t, pkg) {
				t.Errorf("%s (layer %d) imports %s (layer %d): imports must point down",
					pkg, layerOf(t, pkg), dep, layerOf(t, dep))
			}
			checked++
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, checked, 50, "the walk found the module's imports")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("%s is not the module root", root)
	}
}
