package redisproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Cluster is a Redis Cluster of masters without replicas, each a Server with its
// own directory and nodes.conf and no persistence. Its nodes run with
// cluster-node-timeout 2000 and cluster-require-full-coverage no: a dead master
// is marked failed within seconds and the others keep serving their slots.
type Cluster struct {
	nodes []*Server
}

// slots is the number of hash slots of a Redis Cluster.
const slots = 16384

// StartCluster starts masters cluster-enabled servers, each in a directory
// node-N under dir (which must exist), forms a cluster of them that covers every
// slot (redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes; with
// fewer than the 3 masters redis-cli insists on, the slots are assigned and the
// nodes introduced by hand), and waits up to 30 s until every node reports
// cluster_state:ok with every slot served. It takes a few seconds. args are extra
// configuration directives for every node, as for Start. On error the servers it
// started are stopped; otherwise the caller stops them with Stop.
func StartCluster(dir string, masters int, args ...string) (*Cluster, error) {
	if masters < 1 {
		return nil, fmt.Errorf("redisproc: a cluster of %d masters", masters)
	}
	c := &Cluster{}
	for i := range masters {
		ndir := filepath.Join(dir, fmt.Sprintf("node-%d", i))
		if err := os.MkdirAll(ndir, 0o755); err != nil {
			c.Stop()
			return nil, fmt.Errorf("redisproc: %w", err)
		}
		s, err := start(ndir, true, args)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.nodes = append(c.nodes, s)
	}
	var err error
	if masters >= 3 {
		err = c.create()
	} else {
		err = c.formByHand()
	}
	if err == nil {
		err = c.WaitOK(30 * time.Second)
	}
	if err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// create forms the cluster with redis-cli.
func (c *Cluster) create() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redisproc: redis-cli %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// formByHand assigns each node an equal range of slots and introduces the nodes
// to the first one.
func (c *Cluster) formByHand() error {
	n := len(c.nodes)
	for i, s := range c.nodes {
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if _, err := s.Do("CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			return fmt.Errorf("redisproc: CLUSTER ADDSLOTSRANGE %d %d on %s: %w", lo, hi, s.Addr(), err)
		}
		if _, err := s.Do("CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			return fmt.Errorf("redisproc: CLUSTER SET-CONFIG-EPOCH on %s: %w", s.Addr(), err)
		}
	}
	for _, s := range c.nodes[1:] {
		if _, err := c.nodes[0].Do("CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(s.port), strconv.Itoa(s.busPort)); err != nil {
			return fmt.Errorf("redisproc: CLUSTER MEET %s: %w", s.Addr(), err)
		}
	}
	return nil
}

// Stop stops every node (see Server.Stop).
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, s := range c.nodes {
		wg.Go(s.Stop)
	}
	wg.Wait()
}

// Addrs are the nodes' addresses, in the order of Nodes.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.Addr()
	}
	return out
}

// Nodes are the cluster's servers, to Kill and Restart.
func (c *Cluster) Nodes() []*Server { return append([]*Server(nil), c.nodes...) }

// ErrClusterNotOK reports that a cluster did not become healthy in time.
var ErrClusterNotOK = errors.New("redis cluster not ok")

// WaitOK waits until every node reports cluster_state:ok, knows every other node
// and sees all 16384 slots served (no slot of a failing master), and returns an
// error wrapping ErrClusterNotOK that says which node is not when that takes
// longer than timeout.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		bad := c.notOK()
		if bad == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisproc: cluster %v: %w after %v: %s", c.Addrs(), ErrClusterNotOK, timeout, bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// notOK describes the first node that is not healthy, or returns "".
func (c *Cluster) notOK() string {
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	for _, s := range c.nodes {
		wg.Go(func() {
			if why := c.nodeNotOK(s); why != "" {
				mu.Lock()
				bad = append(bad, why)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return strings.Join(bad, "; ")
}

func (c *Cluster) nodeNotOK(s *Server) string {
	info, err := s.do(2*time.Second, "CLUSTER", "INFO")
	if err != nil {
		return fmt.Sprintf("%s: %v", s.Addr(), err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	switch {
	case fields["cluster_state"] != "ok":
		return fmt.Sprintf("%s: cluster_state:%s", s.Addr(), fields["cluster_state"])
	case fields["cluster_slots_ok"] != strconv.Itoa(slots):
		return fmt.Sprintf("%s: cluster_slots_ok:%s pfail:%s fail:%s", s.Addr(), fields["cluster_slots_ok"],
			fields["cluster_slots_pfail"], fields["cluster_slots_fail"])
	case fields["cluster_known_nodes"] != strconv.Itoa(len(c.nodes)):
		return fmt.Sprintf("%s: cluster_known_nodes:%s, want %d", s.Addr(), fields["cluster_known_nodes"], len(c.nodes))
	}
	return ""
}
