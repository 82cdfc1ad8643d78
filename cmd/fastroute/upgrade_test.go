package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// asMain, set in a test binary's environment, has it run as fastroute
// itself (TestMain): the upgrade test starts it as a server, and the
// server's upgrade starts it again.
const asMain = "FASTROUTE_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serverLog collects the lines a fastroute process (and the processes its
// upgrades start, which inherit its stderr) writes.
type serverLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *serverLog) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l.mu.Lock()
		l.lines = append(l.lines, sc.Text())
		l.mu.Unlock()
	}
}

// matches returns the submatches of every line re matches.
func (l *serverLog) matches(re *regexp.Regexp) [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var all [][]string
	for _, line := range l.lines {
		if m := re.FindStringSubmatch(line); m != nil {
			all = append(all, m)
		}
	}
	return all
}

func (l *serverLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// load sends requests through a front end from several clients until
// stopped: some on kept-alive connections, some on a new connection each,
// streamed and not. An answer counts as served when it is a 200 read to
// its end (a stream's [DONE]).
type load struct {
	served, failed atomic.Int64
	mu             sync.Mutex
	errs           []string
	stop           chan struct{}
	done           sync.WaitGroup
}

func startLoad(addr string, clients int) *load {
	l := &load{stop: make(chan struct{})}
	for i := range clients {
		kept := i%2 == 0
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: !kept}}
		stream := i%4 >= 2
		l.done.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				if err := request(c, addr, stream); err != nil {
					l.failed.Add(1)
					l.mu.Lock()
					l.errs = append(l.errs, fmt.Sprintf("kept-alive %t, stream %t: %v", kept, stream, err))
					l.mu.Unlock()
				} else {
					l.served.Add(1)
				}
			}
		})
	}
	return l
}

func request(c *http.Client, addr string, stream bool) error {
	body := fmt.Sprintf(`{"model":"mock-model","stream":%t,"messages":[{"role":"user","content":"hi"}]}`, stream)
	resp, err := c.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return fmt.Errorf("reading the answer: %w", err)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%d %s", resp.StatusCode, b)
	case stream && !strings.Contains(string(b), "data: [DONE]"):
		return fmt.Errorf("stream cut: %q", b)
	}
	return nil
}

// end stops the load and returns what it saw.
func (l *load) end() (served, failed int64, errs []string) {
	close(l.stop)
	l.done.Wait()
	return l.served.Load(), l.failed.Load(), l.errs
}

// copyFile copies an executable.
func copyFile(t *testing.T, from, to string) {
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o755))
}

// replaceFile puts text in path's place as a new file (a rename, as an
// install puts a new build in place), so the running one is untouched.
func replaceFile(t *testing.T, path, text string) {
	require.NoError(t, os.WriteFile(path+".new", []byte(text), 0o755))
	require.NoError(t, os.Rename(path+".new", path))
}

// alive says whether a process runs (and is not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// An upgrade (SIGUSR2) starts the executable at the router's path again,
// a new build put there while it ran: the new process reads the config,
// takes the listeners over with the connections queued on them, writes
// its id in pid_file, and the old one drains and exits. Clients sending
// all along, on kept-alive and new connections, streamed and not, see no
// failure. An upgrade whose new process does not start leaves the old one
// serving.
func TestAnUpgradeHandsTheListenersToANewProcessWithoutAFailedRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("starts router processes")
	}
	var urls []string
	for id := range 2 {
		m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: uint64(id + 1), Tokens: 8, TokenInterval: 2 * time.Millisecond})
		require.NoError(t, err)
		defer m.Close()
		urls = append(urls, m.URL())
	}
	dir := t.TempDir()
	self, err := os.Executable()
	require.NoError(t, err)
	bin, build := filepath.Join(dir, "fastroute"), filepath.Join(dir, "fastroute-new-build")
	copyFile(t, self, bin)
	copyFile(t, self, build)
	pidFile, conf := filepath.Join(dir, "fastroute.pid"), filepath.Join(dir, "fastroute.yaml")
	config := func(mode string) {
		text := fmt.Sprintf("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\npid_file: %s\nshutdown_timeout: 10s\n"+
			"router: {mode: %s}\nworkers:\n  - {id: 1, url: %q}\n  - {id: 2, url: %q}\n", pidFile, mode, urls[0], urls[1])
		require.NoError(t, os.WriteFile(conf, []byte(text), 0o600))
	}
	config("least-loaded")

	// Started as systemd starts a socket-activated Type=notify service:
	// the front end's socket passed (named listen: the config's address
	// does not matter then), and a notify socket to tell of its state.
	front, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	frontFile, err := front.(*net.TCPListener).File()
	require.NoError(t, err)
	notes := listenNotify(t, filepath.Join(dir, "notify"))
	logR, logW, err := os.Pipe()
	require.NoError(t, err)
	var log serverLog
	go log.read(logR)
	old := systemdStart(bin, "serve", "--config", conf)
	old.Env = append(os.Environ(), asMain+"=1", "LISTEN_FDS=1", "LISTEN_FDNAMES=listen", "NOTIFY_SOCKET="+filepath.Join(dir, "notify"))
	old.ExtraFiles = []*os.File{frontFile}
	old.Stderr = logW // a file: Wait does not wait for the new process, which keeps it
	require.NoError(t, old.Start())
	logW.Close()
	frontFile.Close()
	front.Close() // the router holds the socket
	exited := make(chan error, 1)
	go func() { exited <- old.Wait() }()
	newPID := 0
	t.Cleanup(func() {
		for _, pid := range []int{old.Process.Pid, newPID} {
			if pid != 0 && alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			t.Logf("router log:\n%s", &log)
		}
	})

	started := regexp.MustCompile(`msg="fastroute started" listen=(\S+) admin=(\S+) mode=(\S+)`)
	require.Eventually(t, func() bool { return len(log.matches(started)) == 1 }, 10*time.Second, 10*time.Millisecond)
	addr := log.matches(started)[0][1]
	require.Equal(t, front.Addr().String(), addr, "the front end serves the socket systemd passed")
	assert.Equal(t, fmt.Sprintf("READY=1\nMAINPID=%d", old.Process.Pid), notes.next(t))
	// A reload (systemd's Type=notify-reload sends SIGHUP) says it begins
	// and ends.
	require.NoError(t, old.Process.Signal(syscall.SIGHUP))
	assert.Regexp(t, `^RELOADING=1\nMONOTONIC_USEC=[1-9][0-9]*$`, notes.next(t))
	assert.Equal(t, fmt.Sprintf("READY=1\nMAINPID=%d", old.Process.Pid), notes.next(t))
	readPID := func() int {
		b, _ := os.ReadFile(pidFile)
		pid, _ := strconv.Atoi(string(b))
		return pid
	}
	require.Eventually(t, func() bool { return readPID() == old.Process.Pid }, 5*time.Second, 10*time.Millisecond, "pid_file holds the serving process's id")

	l := startLoad(addr, 8)
	time.Sleep(300 * time.Millisecond)

	// A build that cannot start: the old process goes on serving.
	replaceFile(t, bin, "#!/bin/sh\necho 'broken build' >&2\nexit 3\n")
	require.NoError(t, old.Process.Signal(syscall.SIGUSR2))
	failed := regexp.MustCompile(`msg="upgrade failed: this process goes on serving"`)
	require.Eventually(t, func() bool { return len(log.matches(failed)) == 1 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	require.True(t, alive(old.Process.Pid))
	assert.Equal(t, old.Process.Pid, readPID())

	// A new build (a script that leaves its mark, then runs the router)
	// and a new config.
	marker := filepath.Join(dir, "new-build-ran")
	replaceFile(t, bin, fmt.Sprintf("#!/bin/sh\necho $$ > %s\nexec %s \"$@\"\n", marker, build))
	config("round-robin")
	require.NoError(t, old.Process.Signal(syscall.SIGUSR2))
	select {
	case err := <-exited:
		require.NoError(t, err, "the old process drains and exits 0")
	case <-time.After(20 * time.Second):
		t.Fatal("the old process did not exit after its upgrade")
	}
	newPID = readPID()
	require.NotEqual(t, old.Process.Pid, newPID)
	require.True(t, alive(newPID))
	mark, err := os.ReadFile(marker)
	require.NoError(t, err, "the upgrade ran the file at the executable's path")
	assert.Equal(t, strconv.Itoa(newPID), strings.TrimSpace(string(mark)))
	both := log.matches(started)
	require.Len(t, both, 2)
	assert.Equal(t, addr, both[1][1], "the new process serves the same listener")
	assert.Equal(t, "round-robin", both[1][3], "the new process read the config anew")

	// And the old one's drain said nothing: the service runs on.
	assert.Equal(t, fmt.Sprintf("READY=1\nMAINPID=%d", newPID), notes.next(t))
	servedBefore := l.served.Load()
	time.Sleep(300 * time.Millisecond)
	served, failedN, errs := l.end()
	assert.Zero(t, failedN, "failed requests, the first: %v", errs[:min(len(errs), 5)])
	assert.Greater(t, served, servedBefore, "the new process serves")
	assert.Greater(t, servedBefore, int64(50))

	// The new process holds no reservation once the load ended, and
	// drains and exits on SIGTERM.
	admin := both[1][2]
	resp, err := http.Get("http://" + admin + "/workers")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 2, strings.Count(string(b), `"occupancy":0`), "%s", b)
	require.NoError(t, syscall.Kill(newPID, syscall.SIGTERM))
	assert.Equal(t, "STOPPING=1", notes.next(t))
	require.Eventually(t, func() bool { return !alive(newPID) }, 10*time.Second, 20*time.Millisecond)
}

// systemdStart returns a command that runs name with args as systemd runs
// a socket-activated service: LISTEN_PID is the process's own id (the
// shell's, which execs name), for the sockets of LISTEN_FDS from fd 3 on
// (the command's ExtraFiles).
func systemdStart(name string, args ...string) *exec.Cmd {
	return exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, name}, args...)...)
}

// notifySocket receives what a process tells systemd (sd_notify).
type notifySocket struct{ got chan string }

func listenNotify(t *testing.T, path string) notifySocket {
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	n := notifySocket{got: make(chan string, 16)}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			n.got <- string(buf[:k])
		}
	}()
	return n
}

// next returns the next message told to systemd, failing the test when
// none comes within 10 s.
func (n notifySocket) next(t *testing.T) string {
	t.Helper()
	select {
	case got := <-n.got:
		return got
	case <-time.After(10 * time.Second):
		t.Fatal("nothing told to systemd within 10 s")
		return ""
	}
}

// A socket systemd passed is a listener's by its name, or else by its
// address; one that is neither is refused at start, naming it.
func TestSystemdSocketsServeTheirKeys(t *testing.T) {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = ":8080", "127.0.0.1:8081"
	for addr, key := range map[string]string{
		"127.0.0.1:8080": "", "[::]:8080": "listen", "0.0.0.0:8080": "listen",
		"127.0.0.1:8081": "admin_listen", "0.0.0.0:8081": "", "127.0.0.1:9000": "",
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		require.NoError(t, err)
		assert.Equal(t, key, keyOfAddress(cfg, a), addr)
	}

	if testing.Short() {
		t.Skip("starts a router process")
	}
	stray, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer stray.Close()
	f, err := stray.(*net.TCPListener).File()
	require.NoError(t, err)
	defer f.Close()
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := systemdStart(self, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), asMain+"=1", "LISTEN_FDS=1", "LISTEN_FDNAMES=web.socket")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Contains(t, string(out), "socket web.socket from systemd ("+stray.Addr().String()+") is neither listen (127.0.0.1:0) nor admin_listen (127.0.0.1:0)")
}
