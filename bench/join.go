package bench

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/fastroute/fastroute/internal/loopback"
	"github.com/fastroute/fastroute/pickers"
)

// The scale-up comparison's fleet: the main comparison's three engines,
// then gpu-c, like gpu-a, which joins the router (POST /workers on its
// admin listener) at the warm-up's end, as an operator adds an engine to
// a fleet near its capacity.
var joinFleet = append(slices.Clip(routingFleet), simEngine{"gpu-c", 16, 1, false})

// joining is how many engines at the end of joinFleet join at the
// warm-up's end.
const joining = 1

// JoinSetups are the routers of the scale-up comparison: fastroute's modes
// that read the engines (the default and load-aware) and least-loaded,
// each told of gpu-c through its admin API.
func JoinSetups() []RoutingRouter {
	withJoin := func(m pickers.Mode) RoutingRouter {
		var admin string
		return RoutingRouter{
			Name: modeName(m),
			start: func(bin, _ string, workers []string) (string, *exec.Cmd, error) {
				a, err := loopback.FreeAddr()
				if err != nil {
					return "", nil, err
				}
				admin = a
				return startServeAdmin(bin, admin, workers, "--mode", string(m))
			},
			join: func(id int, addr string) error { return addWorker(admin, id, addr) },
		}
	}
	return []RoutingRouter{withJoin(pickers.ModeWeighted), withJoin(pickers.ModeLoadAware), withJoin(pickers.ModeLeastLoaded)}
}

// addWorker adds worker id at addr through the admin API at admin.
func addWorker(admin string, id int, addr string) error {
	body := fmt.Appendf(nil, `{"id":%d,"url":"http://%s"}`, id, addr)
	resp, err := http.Post("http://"+admin+"/workers", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("POST /workers: %d %s", resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return nil
}

// runJoin runs the scale-up comparison: JoinSetups at o.JoinLoad of the
// starting fleet's capacity, measured from the join.
func runJoin(o RoutingOptions, dir string, meanP, meanO float64) ([]RoutingRow, float64, error) {
	startCap := fleetCapacity(joinFleet[:len(joinFleet)-joining], meanP, meanO)
	jobs := workload(o.Seed, o.JoinLoad*startCap, o.Warmup+o.Duration)
	rows, err := runSetups(o, dir, joinFleet, JoinSetups(), o.Routers, jobs, o.JoinLoad, o.JoinLoad*startCap)
	if err != nil {
		return nil, 0, fmt.Errorf("scale-up: %w", err)
	}
	return rows, startCap, nil
}

// JoinTable formats the scale-up comparison.
func JoinTable(rows []RoutingRow, startCap float64, window time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Scale-up: gpu-c (like gpu-a) joins at the warm-up's end, the load %.0f%% of the first three engines' capacity (%.1f req/s), measured over the %v after the join:\n\n",
		100*rows[0].Load, startCap, window)
	windowRows(&b, rows)
	return b.String()
}

// windowRows writes the table of a comparison measured over one window
// after an event (a join, a restart): latencies, throughput, failures and
// the engines' shares, a row a router.
func windowRows(b *strings.Builder, rows []RoutingRow) {
	fmt.Fprintf(b, "| router | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 | completed req/s | failed | share %% (%s) |\n",
		strings.Join(rows[0].WorkerList, "/"))
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %.1f | %d | %s |\n", r.Router, r.lat(r.TTFT, 0.5), r.lat(r.TTFT, 0.99),
			r.lat(r.E2E, 0.5), r.lat(r.E2E, 0.99), r.RPS(), r.Failed, r.Shares())
	}
}
