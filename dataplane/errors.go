package dataplane

import "fmt"

// Code classifies a selection failure; each maps to one HTTP status.
type Code uint8

// The failure classes of DESIGN.md.
const (
	// NoEndpoints: no routable worker (HTTP 503).
	NoEndpoints Code = iota + 1
	// ResourceExhausted: routable workers exist but none is free (HTTP 429).
	ResourceExhausted
	// InvalidArgument: the request itself is wrong (HTTP 400).
	InvalidArgument
	// NotFound: the request names something no worker has (HTTP 404).
	NotFound
)

// String names the code as it appears in error bodies and metrics.
func (c Code) String() string {
	switch c {
	case NoEndpoints:
		return "no_endpoints"
	case ResourceExhausted:
		return "resource_exhausted"
	case InvalidArgument:
		return "invalid_argument"
	case NotFound:
		return "not_found"
	}
	return "unknown"
}

// Error is a typed selection error. Compare with errors.Is against the
// sentinels below, or read Code.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Is matches any *Error with the same Code, so errors.Is(err, ErrNoEndpoints)
// holds for every NoEndpoints error whatever its message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels, returned as they are on the hot path so a failure allocates nothing.
var (
	ErrNoEndpoints       = &Error{Code: NoEndpoints, Msg: "no routable workers"}
	ErrResourceExhausted = &Error{Code: ResourceExhausted, Msg: "all workers are busy"}
	ErrInvalidArgument   = &Error{Code: InvalidArgument, Msg: "invalid argument"}
	ErrNotFound          = &Error{Code: NotFound, Msg: "not found"}
	errMissingWorker     = &Error{Code: InvalidArgument, Msg: "direct mode needs header x-worker-id"}
	// errNoPhaseWorker is, by phase, the error of a pool with no routable
	// worker: a split request's prefill pick meets it on every request
	// while the prefill pool is empty, and runs whole without it.
	errNoPhaseWorker = [...]*Error{
		PhaseAny:     ErrNoEndpoints,
		PhasePrefill: {Code: NoEndpoints, Msg: "no routable worker serves the prefill phase"},
		PhaseDecode:  {Code: NoEndpoints, Msg: "no routable worker serves the decode phase"},
	}
)

// Errorf builds an Error with a formatted message (for the cold error paths).
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// DuplicateError refuses a worker whose id is already registered.
type DuplicateError struct{ ID uint64 }

func (e *DuplicateError) Error() string { return fmt.Sprintf("worker %d is already registered", e.ID) }

// DrainingError refuses a change to a worker being drained: it leaves the
// router once idle (POST /workers adds it again).
type DrainingError struct{ ID uint64 }

func (e *DrainingError) Error() string {
	return fmt.Sprintf("worker %d is draining: it leaves the router once idle (POST /workers adds it again)", e.ID)
}
