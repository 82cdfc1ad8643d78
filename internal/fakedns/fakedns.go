// Package fakedns is a DNS server in miniature on loopback UDP, for tests:
// it answers A, AAAA and SRV questions from a table the test changes as
// it goes, a name it does not hold with NXDOMAIN, and a name set to fail
// with that failure's code.
package fakedns

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/dns/dnsmessage"
)

// Server answers DNS questions on a loopback UDP port until Close.
type Server struct {
	conn    net.PacketConn
	mu      sync.Mutex
	addrs   map[string][]netip.Addr     // name (lower case, rooted) → its addresses
	fail    map[string]dnsmessage.RCode // name → the code it fails with
	srv     map[string][]srvTarget      // SRV name → its targets
	stalled map[string]bool             // names whose questions go unanswered
	done    chan struct{}
}

// srvTarget is one SRV record's target and port.
type srvTarget struct {
	target dnsmessage.Name
	port   uint16
}

// Start serves on a free loopback port.
func Start() (*Server, error) {
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{conn: conn, addrs: map[string][]netip.Addr{}, fail: map[string]dnsmessage.RCode{}, srv: map[string][]srvTarget{}, stalled: map[string]bool{}, done: make(chan struct{})}
	go s.serve()
	return s, nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.conn.LocalAddr().String() }

// Set makes name resolve to addrs (none: a name with no address), and
// stop failing.
func (s *Server) Set(name string, addrs ...string) {
	parsed := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		parsed[i] = netip.MustParseAddr(a)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addrs[rooted(name)] = parsed
	delete(s.fail, rooted(name))
}

// SetSRV makes the SRV name resolve to targets, each host:port (the
// host a name Set resolves).
func (s *Server) SetSRV(name string, targets ...string) {
	parsed := make([]srvTarget, len(targets))
	for i, t := range targets {
		host, port, err := net.SplitHostPort(t)
		p, perr := strconv.ParseUint(port, 10, 16)
		if err != nil || perr != nil {
			panic("fakedns: " + t + " is not host:port")
		}
		parsed[i] = srvTarget{dnsmessage.MustNewName(rooted(host)), uint16(p)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv[rooted(name)] = parsed
	delete(s.fail, rooted(name))
}

// Remove forgets name: it answers NXDOMAIN.
func (s *Server) Remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.addrs, rooted(name))
	delete(s.srv, rooted(name))
	delete(s.fail, rooted(name))
}

// Fail makes questions about name fail with SERVFAIL.
func (s *Server) Fail(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[rooted(name)] = dnsmessage.RCodeServerFailure
}

// Stall leaves questions about name unanswered, as a server that is
// down would.
func (s *Server) Stall(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled[rooted(name)] = true
}

// Close stops the server.
func (s *Server) Close() error {
	err := s.conn.Close()
	<-s.done
	return err
}

func rooted(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, ".")) + "."
}

func (s *Server) serve() {
	defer close(s.done)
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if answer, ok := s.answer(buf[:n]); ok {
			_, _ = s.conn.WriteTo(answer, from)
		}
	}
}

// answer builds the answer to one query: false for one that is not a
// query with a question.
func (s *Server) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	name := rooted(q.Name.String())
	s.mu.Lock()
	if s.stalled[name] {
		s.mu.Unlock()
		return nil, false
	}
	addrs, known := s.addrs[name]
	srvs, isSRV := s.srv[name]
	rcode, failing := s.fail[name]
	s.mu.Unlock()
	known = known || isSRV
	switch {
	case failing:
	case !known:
		rcode = dnsmessage.RCodeNameError
	default:
		rcode = dnsmessage.RCodeSuccess
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode})
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	if rcode == dnsmessage.RCodeSuccess {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
		if q.Type == dnsmessage.TypeSRV {
			for _, t := range srvs {
				_ = b.SRVResource(rh, dnsmessage.SRVResource{Priority: 10, Weight: 1, Port: t.port, Target: t.target})
			}
		}
		for _, a := range addrs {
			switch {
			case q.Type == dnsmessage.TypeA && a.Is4():
				_ = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
			case q.Type == dnsmessage.TypeAAAA && a.Is6():
				_ = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
			}
		}
	}
	out, err := b.Finish()
	return out, err == nil
}
