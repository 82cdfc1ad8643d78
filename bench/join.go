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

// The scale-up comparisons' joining engines: gpu-c, like gpu-a, joins the
// main comparison's three engines at the warm-up's end (POST /workers on
// the router's admin listener), as an operator adds an engine to a fleet
// near its capacity; or cpu-2, like cpu, a slow engine whose speed the
// router does not know yet when it joins.
var (
	fastJoiner = joiner{simEngine{"gpu-c", 16, 1, false}, "like gpu-a"}
	slowJoiner = joiner{simEngine{"cpu-2", 4, 1.0 / 6, false}, "like cpu"}
)

// joiner is the engine that joins a scale-up comparison, and what it is
// like.
type joiner struct {
	engine simEngine
	like   string
}

// fleet is the main comparison's fleet with j last.
func (j joiner) fleet() []simEngine { return append(slices.Clip(routingFleet), j.engine) }

// joining is how many engines at the end of a scale-up comparison's fleet
// join at the warm-up's end.
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

// runJoin runs a scale-up comparison, j joining: JoinSetups at load of the
// starting fleet's capacity, measured from the join.
func runJoin(o RoutingOptions, dir string, j joiner, load, meanP, meanO float64) ([]RoutingRow, float64, error) {
	fleet := j.fleet()
	startCap := fleetCapacity(fleet[:len(fleet)-joining], meanP, meanO)
	jobs := workload(o.Seed, load*startCap, o.Warmup+o.Duration)
	rows, err := runSetups(o, dir, fleet, JoinSetups(), o.Routers, jobs, load, load*startCap)
	if err != nil {
		return nil, 0, fmt.Errorf("scale-up, %s joining: %w", j.engine.name, err)
	}
	return rows, startCap, nil
}

// JoinTable formats a scale-up comparison, j joining.
func JoinTable(rows []RoutingRow, j joiner, startCap float64, window time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Scale-up: %s (%s) joins at the warm-up's end, the load %.0f%% of the first three engines' capacity (%.1f req/s), measured over the %v after the join:\n\n",
		j.engine.name, j.like, 100*rows[0].Load, startCap, window)
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
