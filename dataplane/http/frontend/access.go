package frontend

// Access is which requests get an access line.
type Access int32

// The access log's settings (log.access).
const (
	AccessOff    Access = iota // none
	AccessAll                  // every request
	AccessErrors               // those answered 400 or above, or that did not end well
)

// ParseAccess reads a log.access value: off, all or errors (false for
// anything else).
func ParseAccess(s string) (Access, bool) {
	switch s {
	case "off":
		return AccessOff, true
	case "all":
		return AccessAll, true
	case "errors":
		return AccessErrors, true
	}
	return AccessOff, false
}

// SetAccess changes which requests get an access line (none without
// Options.AccessLog), from the next request on: one under way keeps the
// setting it began with.
func (s *Server) SetAccess(a Access) {
	if s.opts.AccessLog == nil {
		a = AccessOff
	}
	s.access.Store(int32(a))
}
