// Package fuzz holds native Go fuzz targets of fastroute's invariants:
// picker results, select/reserve/release sequences under registry churn,
// and request parsing by the real front-end handler. `make fuzz` runs each
// for a bounded time; `go test ./fuzz` runs the seed corpus as unit tests.
package fuzz
