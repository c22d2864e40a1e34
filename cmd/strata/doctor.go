package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
)

// errCheckFailed is what strata doctor returns when one of its checks failed:
// the check and its fix are printed already, and the command exits 1.
var errCheckFailed = errors.New("a check failed (the FAIL line above says what to do)")

// The arena the doctor's fix line proposes: what strata serve's own checks
// accept on this machine (node/arena.checkRoom, hostmem's allocator: the arena
// must leave serveReserve of MemAvailable), and no more than half of what is
// available, so that the engines beside it keep room for their host pools.
const (
	maxProposedArena = 64 << 30
	serveReserve     = 1 << 30
	// arenaFileHeader bounds the arena file's room beyond the arena and its
	// unit map (arenaFileOverhead): 8 MiB of eviction log after a page of
	// superblock and the unit map, the data then aligned to 2 MiB (node/arena's
	// newGeometry), so at most 10 MiB and two pages more.
	arenaFileHeader = 10<<20 + 8<<10
	// proposedArenaFile is where the README keeps the arena file: on /dev/shm,
	// so that a restarted service finds its objects.
	proposedArenaFile = "/dev/shm/strata/strata.arena"
)

// arenaFileOverhead is what an arena file holds beside an arena of arena
// bytes, at most: 1/1024 of it for the unit map, and arenaFileHeader of
// superblock, eviction log and alignment. python/strata_client/doctor.py
// proposes with the same rule.
func arenaFileOverhead(arena int64) int64 { return arena/1024 + arenaFileHeader }

// arenaForFileRoom is the largest arena whose file fits in free bytes.
func arenaForFileRoom(free int64) int64 { return (free - arenaFileHeader) / 1025 * 1024 }

// machineRoom is what the machine has for an arena: AvailBytes of memory
// (MemAvailable, lowered to the cgroup's headroom) and ShmFreeBytes on /dev/shm
// (-1 when there is no /dev/shm to put the arena file on).
type machineRoom struct {
	AvailBytes   int64
	ShmFreeBytes int64
}

// readMachineRoom reads this machine's room; what cannot be read counts as
// none, so the proposal falls back to the smallest arena.
func readMachineRoom() machineRoom {
	r := machineRoom{ShmFreeBytes: -1}
	if avail, err := hostmem.AvailableBytes(); err == nil {
		r.AvailBytes = avail
	}
	var fs unix.Statfs_t
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() && unix.Statfs("/dev/shm", &fs) == nil {
		r.ShmFreeBytes = int64(fs.Bavail) * fs.Bsize
	}
	return r
}

// proposedArena is the --arena the doctor proposes on a machine with room r:
// min(64 GiB, half of the available memory, the available memory less strata
// serve's reserve, what the arena file's tmpfs holds), in whole GiB; below
// 1 GiB of room, in 64 MiB steps (64 MiB at least), since 1 GiB would be
// refused there. withFile says whether the arena file fits on /dev/shm.
func proposedArena(r machineRoom) (arena int64, withFile bool) {
	room := min(int64(maxProposedArena), r.AvailBytes/2, r.AvailBytes-serveReserve)
	if r.ShmFreeBytes >= 0 {
		fileRoom := arenaForFileRoom(r.ShmFreeBytes)
		if fileRoom >= 1<<30 || fileRoom >= room {
			room, withFile = min(room, fileRoom), true
		}
	}
	if fit := hostmem.FitSize(room); fit > 0 {
		return fit, withFile
	}
	return 64 << 20, false
}

// serveCommand is the strata serve command line that fits room, for socket.
func serveCommand(socket string, room machineRoom) string {
	arena, withFile := proposedArena(room)
	cmd := "strata serve --socket " + socket + " --arena " + hostmem.FormatSize(arena)
	if withFile {
		cmd += " --arena-file " + proposedArenaFile
	}
	return cmd
}

func runDoctor(ctx context.Context, args []string, _ io.Reader, stdout, _ io.Writer) error {
	fs := newFlagSet("doctor", stdout)
	socket := fs.String("socket", "/run/strata/strata.sock", "the node service's socket")
	engine := fs.String("engine", "all", "the engine to check for: sglang, vllm or all")
	timeout := fs.Duration("timeout", 5*time.Second, "the longest each check waits for the service")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *timeout <= 0 {
		return usagef("--timeout %v: want a positive duration, e.g. 5s", *timeout)
	}
	var engines []doctorEngine
	for _, e := range doctorEngines {
		if *engine == "all" || strings.EqualFold(*engine, e.name) {
			engines = append(engines, e)
		}
	}
	if len(engines) == 0 {
		return usagef("--engine %q: want sglang, vllm or all", *engine)
	}
	d := &doctor{w: stdout, socket: *socket, timeout: *timeout, engines: engines, room: readMachineRoom}
	return d.run(ctx)
}

// doctor runs strata doctor's checks against one socket.
type doctor struct {
	w       io.Writer
	socket  string
	timeout time.Duration
	engines []doctorEngine
	// room reads the machine's room for the arena a fix line proposes (a
	// parameter: tests give a machine of their own).
	room func() machineRoom

	conn   *wire.Conn
	nextID uint64
	// clockOffset converts this process's CLOCK_MONOTONIC to the service's.
	clockOffset int64
}

// checkFailure is a check that failed, and what to do about it.
type checkFailure struct{ what, fix string }

func (f *checkFailure) Error() string { return f.what }

func failf(fix, format string, args ...any) error {
	return &checkFailure{what: fmt.Sprintf(format, args...), fix: fix}
}

func (d *doctor) ok(format string, args ...any) {
	fmt.Fprintf(d.w, "ok    "+format+"\n", args...)
}

// run runs the checks in order, each on what the one before established, and
// stops at the first that fails.
func (d *doctor) run(ctx context.Context) error {
	err := d.checks(ctx)
	if d.conn != nil {
		_ = d.conn.Close()
	}
	if f := (*checkFailure)(nil); errors.As(err, &f) {
		fmt.Fprintf(d.w, "FAIL  %s\n      fix: %s\n", f.what, f.fix)
		return errCheckFailed
	}
	if err != nil {
		return err
	}
	for _, e := range d.engines {
		fmt.Fprintf(d.w, "\nStart %s with:\n  %s\nand check that the plugin loads in %s's python (where ./python is installed):\n  PYTHON -m %s doctor --socket %s\n",
			e.name, e.flags(d.socket), e.name, e.module, d.socket)
	}
	return nil
}

func (d *doctor) checks(ctx context.Context) error {
	if err := d.checkSocketFile(); err != nil {
		return err
	}
	if err := d.connect(ctx); err != nil {
		return err
	}
	for _, e := range d.engines {
		if err := d.roundTrip(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// permissionFix is the fix when this user may not use the socket.
func (d *doctor) permissionFix() string {
	return "run the engine (and this doctor) as the service's user, or start strata serve with --socket-mode 0660 " +
		"--socket-group GROUP and add the engine's user to GROUP (the socket's directory must be searchable too)"
}

// checkSocketFile checks that the socket is there, is a socket, and that this
// user may connect to it; it says who owns it and with which mode.
func (d *doctor) checkSocketFile() error {
	st, err := os.Stat(d.socket)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return failf(serveCommand(d.socket, d.room())+" (or pass the socket it listens on with --socket)",
			"no socket at %s: no node service listens there", d.socket)
	case errors.Is(err, os.ErrPermission):
		return failf(d.permissionFix(), "cannot look at %s: %v", d.socket, err)
	case err != nil:
		return failf("pass the socket strata serve listens on with --socket", "cannot look at %s: %v", d.socket, err)
	case st.Mode().Type() != os.ModeSocket:
		return failf("pass the socket strata serve listens on with --socket; if nothing else uses "+d.socket+", remove it and start strata serve",
			"%s is a %s, not a socket", d.socket, fileKind(st.Mode()))
	}
	owner, group := "?", "?"
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		uid, gid := strconv.Itoa(int(sys.Uid)), strconv.Itoa(int(sys.Gid))
		owner, group = "uid "+uid, "gid "+gid
		if u, err := user.LookupId(uid); err == nil {
			owner = u.Username
		}
		if g, err := user.LookupGroupId(gid); err == nil {
			group = g.Name
		}
	}
	// connect(2) on a Unix socket needs write permission on its file.
	if err := unix.Access(d.socket, unix.W_OK); err != nil {
		return failf(d.permissionFix(), "this user (uid %d) may not connect to %s (owner %s:%s, mode %04o): %v",
			os.Getuid(), d.socket, owner, group, st.Mode().Perm(), err)
	}
	note := ""
	if st.Mode().Perm()&0o002 != 0 {
		note = "; any user of this machine may connect: --socket-mode 0660 --socket-group GROUP limits it to GROUP"
	}
	d.ok("%s is a socket this user may connect to (owner %s:%s, mode %04o%s)", d.socket, owner, group, st.Mode().Perm(), note)
	return nil
}

// fileKind names what a path that should be a socket is instead.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "regular file"
	case m&os.ModeSymlink != 0:
		return "symbolic link"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	}
	return "special file"
}

// monotonicNS is this process's CLOCK_MONOTONIC, the clock the service's
// deadlines are in (HelloReply.ClockNS).
func monotonicNS() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for CLOCK_MONOTONIC
	return ts.Nano()
}

// call sends one request and reads its reply, within the doctor's timeout.
func (d *doctor) call(ctx context.Context, t wire.Type, msg wire.Message, fds ...int) (wire.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	d.nextID++
	if err := d.conn.Send(ctx, t, d.nextID, msg, fds...); err != nil {
		return nil, err
	}
	h, m, rfds, err := d.conn.Recv(ctx)
	for _, fd := range rfds {
		_ = unix.Close(fd)
	}
	switch {
	case err != nil:
		return nil, err
	case h.ID != d.nextID:
		return nil, fmt.Errorf("answered request %d with the reply to %d: %w", d.nextID, h.ID, wire.ErrMalformed)
	}
	if e, ok := m.(*wire.Error); ok {
		return nil, fmt.Errorf("%s: %w", e.Message, e.Err())
	}
	return m, nil
}

// connect dials, says Hello, pings, and registers the connection's fence page.
func (d *doctor) connect(ctx context.Context) error {
	t0 := time.Now()
	dctx, cancel := context.WithTimeout(ctx, d.timeout)
	conn, err := wire.Dial(dctx, d.socket)
	cancel()
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return failf("the socket file outlived its service (a crash): start strata serve again: "+serveCommand(d.socket, d.room()),
			"nothing listens on %s (%v)", d.socket, err)
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		return failf(d.permissionFix(), "cannot connect to %s: %v", d.socket, err)
	case err != nil:
		return failf("check that strata serve is running (strata inspect --socket "+d.socket+") and see its log",
			"cannot connect to %s: %v", d.socket, err)
	}
	d.conn = conn
	m, err := d.call(ctx, wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: "strata-doctor", PID: int32(os.Getpid())})
	got := monotonicNS()
	if errors.Is(err, context.DeadlineExceeded) {
		return failf("it is stopped (SIGSTOP, a debugger) or overloaded: see strata inspect --socket "+d.socket+" and its log",
			"the node service at %s accepted the connection but did not answer within %v", d.socket, d.timeout)
	}
	hello, ok := m.(*wire.HelloReply)
	if err != nil || !ok {
		return failf("upgrade strata serve to this strata's release, or see its log",
			"the node service at %s does not answer Hello: %v", d.socket, errOr(err, m))
	}
	nonce := uint64(0x5354) ^ uint64(os.Getpid())
	m, err = d.call(ctx, wire.TypePing, wire.Ping{Nonce: nonce})
	if pong, ok := m.(*wire.Pong); err != nil || !ok || pong.Nonce != nonce {
		return failf("restart strata serve; see its log", "ping: %v", errOr(err, m))
	}
	d.ok("the node service answers (%s, %.1f ms)", hello.ServerVersion, float64(time.Since(t0).Microseconds())/1e3)
	if hello.Starting {
		d.ok("the node service is starting (%d%% of its arena ready): it serves already, from what is ready", hello.ReadyPercent)
	}
	if hello.Warm {
		d.ok("the node service kept its contents across its last restart (warm)")
	}
	if hello.ClockNS == 0 {
		return failf("upgrade strata serve to this strata's release",
			"the node service keeps no client deadlines (an older strata serve): a call that times out may still be copied into or out of the engine's memory after the engine reused it")
	}
	d.clockOffset = int64(hello.ClockNS) - got
	if err := d.registerFence(ctx); err != nil {
		return failf("see strata serve's log; upgrade or restart it", "the node service refused the connection's fence page: %v", err)
	}
	d.ok("a call that times out is never copied afterwards (deadlines, a fence page)")
	return nil
}

// errOr is err, or what the service answered instead of the expected reply.
func errOr(err error, m wire.Message) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("answered %T: %w", m, wire.ErrMalformed)
}

// registerFence registers a fence page the way the plugins do (a sealed 4 KiB memfd).
func (d *doctor) registerFence(ctx context.Context) error {
	fd, err := unix.MemfdCreate("strata-fence", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return fmt.Errorf("memfd_create: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, wire.FenceBytes); err != nil {
		return fmt.Errorf("ftruncate: %w", err)
	}
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	m, err := d.call(ctx, wire.TypeRegisterSegment, wire.RegisterSegment{Size: wire.FenceBytes, Name: "fence", Fence: true}, fd)
	if r, ok := m.(*wire.RegisterSegmentReply); err != nil || !ok || r.SegmentID == 0 {
		return errOr(err, m)
	}
	return nil
}

// deadline is a request's deadline in the service's clock: the doctor's timeout from now.
func (d *doctor) deadline() uint64 {
	return uint64(max(monotonicNS()+d.clockOffset+d.timeout.Nanoseconds(), 1))
}

// roundTrip registers memory of e's kind, puts random bytes from it, gets them
// back into another part of it, removes the object and compares.
func (d *doctor) roundTrip(ctx context.Context, e doctorEngine) error {
	const size = 1 << 20
	fd, err := e.makeSegment(size)
	if err != nil {
		return failf("see that /dev/shm is a writable tmpfs", "cannot make %s: %v", e.segment, err)
	}
	defer unix.Close(fd)
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return failf("see that /dev/shm is a writable tmpfs", "cannot map %s: %v", e.segment, err)
	}
	defer unix.Munmap(mem)
	m, err := d.call(ctx, wire.TypeRegisterSegment, wire.RegisterSegment{Size: size, Name: "doctor"}, fd)
	reg, ok := m.(*wire.RegisterSegmentReply)
	if err != nil || !ok {
		return failf("upgrade strata serve to a release that accepts unsealed memfds, or raise --client-quota if the reason is the quota",
			"the service refused %s: %v", e.segment, errOr(err, m))
	}
	d.ok("%s registers", e.segment)
	const n, back = 64 << 10, size / 2
	data := mem[:n]
	if _, err := rand.Read(data); err != nil {
		return fmt.Errorf("random bytes: %w", err)
	}
	var tag [8]byte
	_, _ = rand.Read(tag[:])
	key := fmt.Sprintf("strata-doctor:%d-%s", os.Getpid(), hex.EncodeToString(tag[:]))
	item := func(off uint64) []wire.Item {
		return []wire.Item{{Key: key, Format: 0x5354, Ranges: []wire.Range{{Segment: reg.SegmentID, Offset: off, Length: n}}}}
	}
	put, err := d.call(ctx, wire.TypePut, wire.Put{Items: item(0), DeadlineNS: d.deadline()})
	if err != nil {
		return failf("see strata serve's log", "put: %v", err)
	}
	get, err := d.call(ctx, wire.TypeGet, wire.Get{Items: item(back), DeadlineNS: d.deadline(), FenceSlot: 1})
	if err != nil {
		return failf("see strata serve's log", "get: %v", err)
	}
	if _, err := d.call(ctx, wire.TypeRemove, wire.Remove{Keys: []string{key}}); err != nil {
		return failf("see strata serve's log", "remove: %v", err)
	}
	if err := batchErr(put, "put"); err != nil {
		return failf("give strata serve a larger --arena; see its log", "put/get round trip: %v", err)
	}
	if err := batchErr(get, "get"); err != nil {
		return failf("see strata serve's log", "put/get round trip: %v", err)
	}
	if !bytes.Equal(mem[back:back+n], data) {
		return failf("report a bug, with strata serve's log", "the put/get round trip through %s returned other bytes", e.segment)
	}
	d.ok("a put/get round trip through %s's memory returns the same bytes", e.name)
	return nil
}

// batchErr is the failure of a one-item Put or Get, nil when it succeeded.
func batchErr(m wire.Message, op string) error {
	r, ok := m.(*wire.BatchReply)
	switch {
	case !ok || len(r.Results) != 1:
		return fmt.Errorf("%s answered %T: %w", op, m, wire.ErrMalformed)
	case r.Results[0].Status != wire.OK:
		return fmt.Errorf("%s: %s (%s)", op, r.Results[0].Status, r.Results[0].Message)
	}
	return nil
}
