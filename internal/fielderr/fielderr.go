// Package fielderr is the error of a checked config list (model aliases,
// model mirrors): the field at fault, as the config names it
// (model_mirrors[1].percent), and why, so that the config reports the key.
package fielderr

import "fmt"

// Error is what is wrong with a list: the field and why.
type Error struct{ Field, Reason string }

func (e *Error) Error() string { return e.Field + ": " + e.Reason }

// New returns the *Error of field, its reason formatted.
func New(field, format string, args ...any) error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}
