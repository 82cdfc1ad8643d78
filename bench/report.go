package bench

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"
)

// percentiles are the latency points of the table and the plot.
var percentiles = []struct {
	label string
	q     float64
}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}, {"p99.9", 0.999}}

// Table formats the rows as a Markdown table, one block per workload, with
// each front's throughput relative to direct and to nginx and its p99
// relative to nginx's.
func Table(rows []Row, o E2EOptions) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d connections, %v per front end and workload, %d mock workers, %d CPUs, %s\n\n",
		o.Connections, o.Duration, o.Workers, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"))
	if o.Rounds > 1 {
		fmt.Fprintf(&b, "%d rounds, the front ends interleaved: each row is the front end's median round, "+
			"CPU µs/req with its least and most over the rounds; p99 vs nginx and CPU vs nginx-1w are the "+
			"medians over the rounds of each round's ratio, CPU's with its least and most; user µs/req is the "+
			"user-space part of the median round's CPU, its ratio the median of the rounds' user-space ratios to nginx-1w's\n\n", o.Rounds)
	}
	b.WriteString("| workload | front end | req/s | p50 | p90 | p99 | p99.9 | req/s vs direct | req/s vs nginx | p99 vs nginx | CPU µs/req | CPU vs nginx-1w | user µs/req | peak RSS |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		direct, nginx := find(rows, r.Workload, "direct"), find(rows, r.Workload, "nginx")
		fmt.Fprintf(&b, "| %s | %s | %.0f |", r.Workload, r.Front, r.Result.RPS())
		for _, p := range percentiles {
			fmt.Fprintf(&b, " %s |", fmtDur(r.Result.Percentile(p.q)))
		}
		p99 := ratio(float64(r.Result.P99), float64(nginx.P99))
		if r.P99Ratio > 0 {
			p99 = fmt.Sprintf("%.2f×", r.P99Ratio)
		}
		fmt.Fprintf(&b, " %s | %s | %s |", ratio(r.Result.RPS(), direct.RPS()), ratio(r.Result.RPS(), nginx.RPS()), p99)
		if r.Result.CPUPerRequest == 0 {
			b.WriteString(" - | - | - | - |\n")
			continue
		}
		cpu := fmt.Sprintf("%.1f", micros(r.Result.CPUPerRequest))
		if r.CPUMost > 0 {
			cpu += fmt.Sprintf(" (%.1f–%.1f)", micros(r.CPULeast), micros(r.CPUMost))
		}
		vs := ratio(float64(r.Result.CPUPerRequest), float64(find(rows, r.Workload, "nginx-1w").CPUPerRequest))
		if r.CPURatio > 0 {
			vs = fmt.Sprintf("%.2f×", r.CPURatio)
			if r.CPURatioMost > r.CPURatioLeast {
				vs += fmt.Sprintf(" (%.2f–%.2f)", r.CPURatioLeast, r.CPURatioMost)
			}
		}
		user := "-"
		if r.Result.UserCPUPerRequest > 0 {
			vs := ratio(float64(r.Result.UserCPUPerRequest), float64(find(rows, r.Workload, "nginx-1w").UserCPUPerRequest))
			if r.UserRatio > 0 {
				vs = fmt.Sprintf("%.2f×", r.UserRatio)
			}
			user = fmt.Sprintf("%.1f (%s)", micros(r.Result.UserCPUPerRequest), vs)
		}
		fmt.Fprintf(&b, " %s | %s | %s | %.1f MiB |\n", cpu, vs, user,
			float64(r.Result.PeakRSS)/(1<<20))
	}
	return b.String()
}

// micros is d in microseconds.
func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func find(rows []Row, workload, front string) Result {
	for _, r := range rows {
		if r.Workload == workload && r.Front == front {
			return r.Result
		}
	}
	return Result{}
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%d µs", d.Microseconds())
}

// logPanel draws a latency panel with a log scale from the decade below lo
// to the one above hi: title, frame, 1-2-5 gridlines and their labels. It
// returns the y of a latency (values below the scale sit on its floor) and
// the floor.
func logPanel(b *strings.Builder, x0, top, pw, ph, lo, hi float64, title string) (y func(float64) float64, floor float64) {
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	y = func(v float64) float64 {
		return top + ph - ph*(math.Log10(math.Max(v, lo))-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-size="14" text-anchor="middle">%s</text>`+"\n", x0+pw/2, top-15, title)
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", x0, top, pw, ph)
	for v := lo; v <= hi*1.0001; v *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if t := v * m; t <= hi*1.0001 {
				fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, x0+pw, y(t), y(t))
				fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-5, y(t)+4, fmtDur(time.Duration(t)))
			}
		}
	}
	return y, lo
}

// frontColors gives each front end one color in every panel.
var frontColors = map[string]string{"direct": "#7f7f7f", "fastroute": "#d62728", "nginx": "#2ca02c", "nginx-1w": "#98df8a", "haproxy": "#1f77b4",
	"floor-goroutines": "#9467bd", "floor-epoll": "#c5b0d5", "floor-coroutines": "#8c564b"}

// Plot draws latency against percentile, one panel per workload, one line
// per front end, on a log scale, as a standalone SVG.
func Plot(rows []Row) string {
	var workloads []string
	for _, r := range rows {
		if len(workloads) == 0 || workloads[len(workloads)-1] != r.Workload {
			workloads = append(workloads, r.Workload)
		}
	}
	const pw, ph, left, top, bottom, gap = 420.0, 300.0, 70.0, 40.0, 50.0, 40.0
	width := left + float64(len(workloads))*(pw+gap+left) - left
	height := top + ph + bottom + 30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for i, wl := range workloads {
		x0 := left + float64(i)*(pw+gap+left)
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range rows {
			if r.Workload != wl {
				continue
			}
			for _, p := range percentiles {
				v := float64(r.Result.Percentile(p.q))
				if v > 0 {
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
			}
		}
		if math.IsInf(lo, 0) {
			continue
		}
		y, lo := logPanel(&b, x0, top, pw, ph, lo, hi, wl+": latency by percentile (log scale)")
		x := func(j int) float64 { return x0 + pw*(float64(j)+0.5)/float64(len(percentiles)) }
		for j, p := range percentiles {
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x(j), top+ph+18, p.label)
		}
		for _, r := range rows {
			if r.Workload != wl {
				continue
			}
			var pts []string
			for j, p := range percentiles {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(j), y(math.Max(float64(r.Result.Percentile(p.q)), lo))))
			}
			c := frontColors[r.Front]
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), c)
			for _, pt := range pts {
				xy := strings.Split(pt, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], c)
			}
		}
	}
	lx := left
	for _, f := range fronts {
		if !slices.ContainsFunc(rows, func(r Row) bool { return r.Front == f.name }) {
			continue
		}
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="14" height="4" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			lx, height-20, frontColors[f.name], lx+18, height-15, f.name)
		lx += 130
	}
	b.WriteString("</svg>\n")
	return b.String()
}
