package router

import (
	"cmp"
	"slices"

	"github.com/fastroute/fastroute/dataplane/metrics"
)

// stateCollector writes the families of the state kept below the core
// (LoRA loads, session pins, the embedding cache): those packages expose
// counts, and the Prometheus text is written here, in one place. The
// process's goroutine count comes last.
func (r *Router) stateCollector() metrics.Collector {
	return func(w *metrics.Writer) {
		type load struct {
			name string
			n    int64
		}
		var loads []load
		r.Registry.GroupLoads(func(name string, n int64) { loads = append(loads, load{name, n}) })
		slices.SortFunc(loads, func(a, b load) int { return cmp.Compare(a.name, b.name) })
		w.Header("fastroute_lora_inflight", "gauge", "Requests in flight routed to a LoRA adapter's workers.")
		for _, l := range loads {
			w.Sample("fastroute_lora_inflight", float64(l.n), "lora", l.name)
		}

		evicted, expired := r.Sessions.Evictions()
		w.Header("fastroute_affinity_sessions", "gauge", "Sessions pinned to a worker.")
		w.Sample("fastroute_affinity_sessions", float64(r.Sessions.Len()))
		w.Header("fastroute_affinity_evictions_total", "counter", "Sessions removed, by reason.")
		w.Sample("fastroute_affinity_evictions_total", float64(evicted), "reason", "max_sessions")
		w.Sample("fastroute_affinity_evictions_total", float64(expired), "reason", "ttl")
		w.Single("fastroute_stored_responses", "gauge", "Stored responses (Responses API) whose worker the router knows.", float64(r.Responses.Len()))

		if r.prefixes.Load() != nil {
			taken, passed, unknown := r.Selector.PrefixRouted()
			w.Header("fastroute_prefix_requests_total", "counter",
				"Generation requests keyed by their prompt's prefixes: sent to the worker holding the longest known one (taken), sent elsewhere (passed: that worker busier than the slack allows, or not a candidate), or with no prefix known (unknown).")
			w.Sample("fastroute_prefix_requests_total", float64(taken), "outcome", "taken")
			w.Sample("fastroute_prefix_requests_total", float64(passed), "outcome", "passed")
			w.Sample("fastroute_prefix_requests_total", float64(unknown), "outcome", "unknown")
			w.Single("fastroute_prefix_learned_records_total", "counter", "Prefix records taken in from peer replicas.", float64(r.prefixLearned.Load()))
		}
		r.writeTLSFamilies(w)
		if c := r.Selector.Routing().EmbedCache; c != nil {
			w.Header("fastroute_embedding_cache_hits_total", "counter", "Embedding inputs found in the cache table.")
			w.Sample("fastroute_embedding_cache_hits_total", float64(c.Hits()))
			w.Header("fastroute_embedding_cache_misses_total", "counter", "Embedding inputs not found in the cache table.")
			w.Sample("fastroute_embedding_cache_misses_total", float64(c.Misses()))
			w.Header("fastroute_embedding_cache_keys", "gauge", "Keys held by the embedding cache table.")
			w.Sample("fastroute_embedding_cache_keys", float64(c.Len()))
		}

	}
}

// writeTLSFamilies writes the families of the certificates and revocation
// lists the router read (none without TLS): when each certificate expires
// and when each list is due to be replaced, for alerts before either
// refuses anyone, and the handshakes the lists refused.
func (r *Router) writeTLSFamilies(w *metrics.Writer) {
	if certs := r.shown(); len(certs) > 0 {
		w.Header("fastroute_tls_certificate_expiry_timestamp_seconds", "gauge",
			"When each certificate the router shows expires (its notAfter), by the config key that names it: tls (the front end's), admin_tls (the admin listener's), worker_tls (its client certificate).")
		for _, c := range certs {
			w.Sample("fastroute_tls_certificate_expiry_timestamp_seconds", float64(c.Leaf.NotAfter.Unix()), "certificate", c.Key)
		}
	}
	fc := r.cert.cur.Load()
	if fc == nil || fc.crls == nil {
		return
	}
	w.Header("fastroute_tls_client_crl_next_update_timestamp_seconds", "gauge",
		"When each issuer's revocation list of tls.client_crl_file is due to be replaced (its nextUpdate): past it, every client certificate the issuer signed is refused until a current list is read.")
	for _, u := range fc.crls.NextUpdates() {
		if !u.Next.IsZero() {
			w.Sample("fastroute_tls_client_crl_next_update_timestamp_seconds", float64(u.Next.Unix()), "issuer", u.Issuer)
		}
	}
	w.Header("fastroute_tls_client_crl_refusals_total", "counter",
		"Client handshakes tls.client_crl_file's revocation lists refused, by reason: a certificate of the chain revoked, no CRL of its issuer, its issuer's CRL out of date, or not signed by that issuer.")
	for i, reason := range crlReasons {
		w.Sample("fastroute_tls_client_crl_refusals_total", float64(r.cert.refused[i].Load()), "reason", reason)
	}
}
