package router

import (
	"sync"
	"time"

	"github.com/fastroute/fastroute/dataplane/metrics"
)

// reloads counts the config reloads from the source (SIGHUP, POST
// /config/reload) for the scrape, so that a refused reload, or one that
// held keys back for a restart, can raise an alert: the log says so
// too, but the running config stays and nothing else shows it.
type reloads struct {
	mu          sync.Mutex // taken by a reload's end and by scrapes, off the request path
	applied     uint64
	refused     uint64
	lastOK      bool      // the last reload applied (true before any)
	loaded      time.Time // the start, or the last reload that applied
	needRestart []string  // the keys the last reload that applied held back
}

func newReloads(start time.Time) *reloads { return &reloads{lastOK: true, loaded: start} }

// record counts a reload that applied (err nil; needRestart: the keys it
// held back) or was refused.
func (c *reloads) record(needRestart []string, err error, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastOK = err == nil; !c.lastOK {
		c.refused++
		return
	}
	c.applied++
	c.loaded, c.needRestart = at, needRestart
}

// collector writes the reloads' families.
func (c *reloads) collector() metrics.Collector {
	return func(w *metrics.Writer) {
		c.mu.Lock()
		defer c.mu.Unlock()
		w.Header("fastroute_config_reloads_total", "counter",
			"Config reloads (SIGHUP, POST /config/reload) by result: applied, or refused (a config that does not load or validate; the running one stays).")
		w.Sample("fastroute_config_reloads_total", float64(c.applied), "result", "applied")
		w.Sample("fastroute_config_reloads_total", float64(c.refused), "result", "refused")
		ok := 0.0
		if c.lastOK {
			ok = 1
		}
		w.Single("fastroute_config_last_reload_successful", "gauge",
			"1 when the last config reload applied, or none was tried since the start; 0 when it was refused.", ok)
		w.Single("fastroute_config_last_reload_success_timestamp_seconds", "gauge",
			"When the running config was loaded: the start, or the last reload that applied.", float64(c.loaded.UnixNano())/1e9)
		w.Header("fastroute_config_need_restart", "gauge",
			"1 for each key of the config file the running router holds back until a restart (the last applied reload's need_restart).")
		for _, key := range c.needRestart {
			w.Sample("fastroute_config_need_restart", 1, "key", key)
		}
	}
}
