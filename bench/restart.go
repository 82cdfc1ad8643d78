package bench

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/fastroute/fastroute/pickers"
)

// RestartSetups are the routers of the restart comparison: fastroute's
// modes that read the engines (the default and load-aware) and
// least-loaded, each started again at the warm-up's end in front of the
// main comparison's engines, which served the warm-up through its first
// instance.
func RestartSetups() []RoutingRouter {
	var out []RoutingRouter
	for _, m := range []pickers.Mode{pickers.ModeWeighted, pickers.ModeLoadAware, pickers.ModeLeastLoaded} {
		out = append(out, RoutingRouter{Name: modeName(m), start: fastrouteMode(m), restarted: true})
	}
	return out
}

// runRestart runs the restart comparison: RestartSetups on routingFleet at
// o.RestartLoad of its capacity, measured from the router's start.
func runRestart(o RoutingOptions, dir string, fleetCap float64) ([]RoutingRow, error) {
	jobs := workload(o.Seed, o.RestartLoad*fleetCap, o.Warmup+o.Duration)
	rows, err := runSetups(o, dir, routingFleet, RestartSetups(), o.Routers, jobs, o.RestartLoad, o.RestartLoad*fleetCap)
	if err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	return rows, nil
}

// RestartTable formats the restart comparison.
func RestartTable(rows []RoutingRow, fleetCap float64, window fmt.Stringer) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Restart: the router starts again at the warm-up's end in front of the main comparison's engines, busy with the warm-up's requests (sent through another instance of the same router), "+
		"the load %.0f%% of their capacity (%.1f req/s), measured over the %v after the start:\n\n", 100*rows[0].Load, fleetCap, window)
	windowRows(&b, rows)
	return b.String()
}

// waitListening waits until addr accepts a connection, trying every 5 ms,
// as the clients of a restarted router reconnect: a request sent then
// waits in the listener's backlog until the router serves.
func waitListening(addr string) error {
	return retryEvery(10*time.Second, 5*time.Millisecond, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}
