// Package filetree writes a tree of files for a test: the stand-in /proc
// and /sys roots the CPU and cgroup readers are tested on.
package filetree

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Write writes files (a path below the root → its content) under a new
// temporary directory of tb, and returns the directory.
func Write(tb testing.TB, files map[string]string) string {
	tb.Helper()
	root := tb.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		require.NoError(tb, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(tb, os.WriteFile(p, []byte(content), 0o644))
	}
	return root
}
