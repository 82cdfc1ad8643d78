package admin

import (
	"net/http"
	"time"

	"github.com/fastroute/fastroute/dataplane/apikeys"
)

// APIKeyInfo is how GET /api_keys shows one client's API key: its name
// and options, never the key (but the client certificate's name that
// stands for one), and its counts.
type APIKeyInfo struct {
	Name              string     `json:"name"`
	ClientCert        string     `json:"client_cert,omitempty"`
	MaxInflight       int64      `json:"max_inflight"`
	TokensPerMinute   int64      `json:"tokens_per_minute"`
	RequestsPerMinute int64      `json:"requests_per_minute"`
	Priority          *int64     `json:"priority,omitempty"`
	Models            []string   `json:"models,omitempty"`
	Expires           *time.Time `json:"expires,omitempty"`
	Inflight          int64      `json:"inflight"`
	RecentTokens      uint64     `json:"recent_tokens"`   // over the last minute
	RecentRequests    uint64     `json:"recent_requests"` // admitted over the last minute (counted while it has a requests_per_minute)
	// The other replicas' tokens and requests over their last minute and
	// requests in flight, as they last shared them (api_keys_share_interval).
	PeerRecentTokens   uint64 `json:"peer_recent_tokens"`
	PeerRecentRequests uint64 `json:"peer_recent_requests"`
	PeerInflight       int64  `json:"peer_inflight"`
	PromptTokens       uint64 `json:"prompt_tokens"`
	CompletionTokens   uint64 `json:"completion_tokens"`
	Admitted           uint64 `json:"admitted"`
	// Refused counts the key's requests answered 429 for a cap, or 401
	// once it expired.
	Refused struct {
		MaxInflight       uint64 `json:"max_inflight"`
		TokensPerMinute   uint64 `json:"tokens_per_minute"`
		RequestsPerMinute uint64 `json:"requests_per_minute"`
		Expired           uint64 `json:"expired"`
	} `json:"refused"`
}

// apiKeysJSON describes the running keys (none while api_keys_file is
// unset), sorted by name.
func apiKeysJSON(keys *apikeys.Keys, now time.Time) []APIKeyInfo {
	out := []APIKeyInfo{}
	if keys == nil {
		return out
	}
	for _, c := range keys.Clients() {
		info := APIKeyInfo{Name: c.Name(), ClientCert: c.Cert(), MaxInflight: c.MaxInflight(), TokensPerMinute: c.TokensPerMinute(),
			Models: c.Models(), Inflight: c.Inflight(), RecentTokens: c.RecentTokens(now), Admitted: c.Admitted(),
			PeerRecentTokens: c.PeerTokens(), PeerInflight: c.PeerInflight(),
			RequestsPerMinute: c.RequestsPerMinute(), RecentRequests: c.RecentRequests(now), PeerRecentRequests: c.PeerRequests()}
		if p, ok := c.Priority(); ok {
			info.Priority = &p
		}
		if t := c.Expires(); !t.IsZero() {
			t = t.UTC()
			info.Expires = &t
		}
		info.PromptTokens, info.CompletionTokens = c.Tokens()
		info.Refused.MaxInflight = c.Limited(apikeys.OverInflight)
		info.Refused.TokensPerMinute = c.Limited(apikeys.OverTokens)
		info.Refused.RequestsPerMinute = c.Limited(apikeys.OverRequests)
		info.Refused.Expired = c.Limited(apikeys.Expired)
		out = append(out, info)
	}
	return out
}

func (o Options) serveAPIKeys(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, apiKeysJSON(o.APIKeys, time.Now()))
}
