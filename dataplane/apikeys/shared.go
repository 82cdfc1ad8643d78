package apikeys

import "time"

// Usage is what one client uses of its caps on one replica: the tokens
// its answers reported and the requests admitted over the last minute,
// and its requests in flight.
// Replicas in front of the same workers send theirs to one another, so
// that a client's caps hold across them (SetPeerUsage).
type Usage struct {
	Name     string `json:"name"`
	Tokens   uint64 `json:"tokens"`
	Requests uint64 `json:"requests"`
	Inflight int64  `json:"inflight"`
}

// Usage returns every client's usage on this replica at now, by name.
func (k *Keys) Usage(now time.Time) []Usage {
	clients := k.Clients()
	out := make([]Usage, len(clients))
	for i, c := range clients {
		out[i] = Usage{Name: c.name, Tokens: c.RecentTokens(now), Requests: c.RecentRequests(now), Inflight: c.Inflight()}
	}
	return out
}

// SetPeerUsage makes others, the usage the other replicas last reported
// (each client's entries summed by name), count in every client's
// admissions from now on beside its own: a client none of them named
// counts nothing there, a name no client has is ignored.
func (k *Keys) SetPeerUsage(others []Usage) {
	tokens, requests, inflight := map[string]uint64{}, map[string]uint64{}, map[string]int64{}
	for _, u := range others {
		tokens[u.Name] += u.Tokens
		requests[u.Name] += u.Requests
		inflight[u.Name] += max(u.Inflight, 0)
	}
	for _, c := range k.Clients() {
		c.peerTokens.Store(tokens[c.name])
		c.peerRequests.Store(requests[c.name])
		c.peerInflight.Store(inflight[c.name])
	}
}

// PeerTokens are the tokens the other replicas last reported the client's
// answers used over their last minute.
func (c *Client) PeerTokens() uint64 { return c.peerTokens.Load() }

// PeerRequests are the client's requests the other replicas last reported
// admitting over their last minute.
func (c *Client) PeerRequests() uint64 { return c.peerRequests.Load() }

// PeerInflight are the client's requests in flight on the other replicas,
// as they last reported them.
func (c *Client) PeerInflight() int64 { return c.peerInflight.Load() }
