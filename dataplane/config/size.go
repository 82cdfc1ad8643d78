package config

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Size is a byte count written as a number or with a unit: 65536, 64KiB,
// 16MiB, 1GiB (binary), 64KB, 16MB (decimal). It is a flag.Value too.
type Size int

var sizeUnits = []struct {
	suffix string
	scale  int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"B", 1},
}

// ParseSize reads a Size.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	scale := int64(1)
	for _, u := range sizeUnits {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, scale = strings.TrimSpace(num), u.scale
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/scale {
		return 0, fmt.Errorf("%q is not a size (a byte count, or a number with KiB, MiB, GiB, KB, MB or GB)", s)
	}
	return Size(n * scale), nil
}

// String writes the size in bytes.
func (s *Size) String() string { return strconv.Itoa(int(*s)) }

// Set parses a flag value.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// UnmarshalYAML accepts a number or a string with a unit.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a size such as 16MiB", n.Line)
	}
	v, err := ParseSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*s = v
	return nil
}
