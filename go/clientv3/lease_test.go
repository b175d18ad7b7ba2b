package clientv3diff

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func TestLeaseDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		grant, err := cli.Grant(ctxT(t), 30)
		if err != nil {
			t.Fatal(err)
		}
		tr.add("grant: id set %t ttl %d", grant.ID != 0, grant.TTL)
		for _, k := range []string{"lease/a", "lease/b"} {
			_, err := cli.Put(ctxT(t), k, "v", clientv3.WithLease(grant.ID))
			tr.add("put %s with lease: %s", k, errName(err))
		}
		ttl, err := cli.TimeToLive(ctxT(t), grant.ID, clientv3.WithAttachedKeys())
		// etcd lists a lease's keys from a Go map, so their order changes from
		// run to run: the transcript compares them as a set.
		keys := make([]string, len(ttl.Keys))
		for i, k := range ttl.Keys {
			keys[i] = string(k)
		}
		sort.Strings(keys)
		tr.add("time to live: %s granted %d remaining>0 %t keys %q", errName(err), ttl.GrantedTTL, ttl.TTL > 0, keys)
		leases, err := cli.Leases(ctxT(t))
		tr.add("leases: %s %d", errName(err), len(leases.Leases))
		once, err := cli.KeepAliveOnce(ctxT(t), grant.ID)
		tr.add("keepalive once: %s ttl %d", errName(err), once.TTL)

		ctx, cancel := context.WithCancel(context.Background())
		ch, err := cli.KeepAlive(ctx, grant.ID)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ka := <-ch:
			tr.add("keepalive stream: ttl %d", ka.TTL)
		case <-time.After(requestTimeout):
			t.Fatal("no keepalive response")
		}
		cancel()

		// Watch the keys, then revoke: both go, and the watcher sees both deletes.
		wch := cli.Watch(ctxT(t), "lease/", clientv3.WithPrefix(), clientv3.WithPrevKV())
		_, err = cli.Revoke(ctxT(t), grant.ID)
		tr.add("revoke: %s", errName(err))
		select {
		case resp := <-wch:
			for _, ev := range resp.Events {
				tr.add("watch: %s %s prev %q", ev.Type, ev.Kv.Key, ev.PrevKv.Value)
			}
		case <-time.After(requestTimeout):
			t.Fatal("the revoke's deletes were not watched")
		}
		get, err := cli.Get(ctxT(t), "lease/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		tr.add("keys after revoke: %s %d", errName(err), get.Count)
		ttl, err = cli.TimeToLive(ctxT(t), grant.ID)
		tr.add("time to live after revoke: %s ttl %d", errName(err), ttl.TTL)
		_, err = cli.Revoke(ctxT(t), grant.ID)
		tr.add("revoke again: %s", errName(err))
		_, err = cli.KeepAliveOnce(ctxT(t), grant.ID)
		tr.add("keepalive revoked: %s", errName(err))
		_, err = cli.Grant(ctxT(t), 9_000_000_001)
		tr.add("grant too long: %s", errName(err))
	})
}

func TestLeaseExpiryDeletesKeysDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		grant, err := cli.Grant(ctxT(t), 2)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctxT(t), "exp/k", "v", clientv3.WithLease(grant.ID)); err != nil {
			t.Fatal(err)
		}
		// No keepalive: the lease runs out, and a watcher sees its key deleted with prev_kv.
		wch := cli.Watch(ctxT(t), "exp/", clientv3.WithPrefix(), clientv3.WithPrevKV())
		select {
		case resp := <-wch:
			for _, ev := range resp.Events {
				tr.add("watch: %s %s prev %q", ev.Type, ev.Kv.Key, ev.PrevKv.Value)
			}
		case <-time.After(requestTimeout):
			t.Fatal("the expired lease's key was not deleted")
		}
		ttl, err := cli.TimeToLive(ctxT(t), grant.ID)
		tr.add("time to live after expiry: %s ttl %d", errName(err), ttl.TTL)
	})
}

// session is a concurrency session (a lease of 10 s, kept alive), closed when the test ends.
func session(t *testing.T, cli *clientv3.Client) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestMutexDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		s1, s2 := session(t, cli), session(t, cli)
		m1 := concurrency.NewMutex(s1, "locks/a")
		m2 := concurrency.NewMutex(s2, "locks/a")
		tr.add("m1 lock: %s", errName(m1.Lock(ctxT(t))))
		err := m2.TryLock(ctxT(t))
		tr.add("m2 try lock while held: %v", err)
		got := make(chan error, 1)
		go func() { got <- m2.Lock(ctxT(t)) }()
		select {
		case err := <-got:
			t.Fatalf("m2 took the held lock: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		// A write fenced on m1's ownership succeeds while m1 holds the lock...
		fenced := func(m *concurrency.Mutex, key string) string {
			resp, err := cli.Txn(ctxT(t)).If(m.IsOwner()).Then(clientv3.OpPut(key, "x")).Commit()
			if err != nil {
				return errName(err)
			}
			return fmt.Sprintf("succeeded=%t", resp.Succeeded)
		}
		tr.add("fenced write by m1 while holding: %s", fenced(m1, "locks/data"))
		tr.add("m1 unlock: %s", errName(m1.Unlock(ctxT(t))))
		select {
		case err := <-got:
			tr.add("m2 lock after unlock: %s", errName(err))
		case <-time.After(requestTimeout):
			t.Fatal("m2 never took the lock")
		}
		// ...and fails once m1 has let go.
		tr.add("fenced write by m1 after unlock: %s", fenced(m1, "locks/data"))
		tr.add("fenced write by m2: %s", fenced(m2, "locks/data"))
		tr.add("m2 unlock: %s", errName(m2.Unlock(ctxT(t))))
	})
}

func TestElectionDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		s1, s2 := session(t, cli), session(t, cli)
		e1 := concurrency.NewElection(s1, "elect/")
		e2 := concurrency.NewElection(s2, "elect/")
		tr.add("e1 campaign: %s", errName(e1.Campaign(ctxT(t), "one")))
		obsCtx, cancel := context.WithCancel(context.Background())
		defer cancel()
		obs := concurrency.NewElection(s2, "elect/").Observe(obsCtx)
		second := make(chan error, 1)
		go func() { second <- e2.Campaign(ctxT(t), "two") }()
		leader := func() string {
			resp, err := e1.Leader(ctxT(t))
			if err != nil {
				return errName(err)
			}
			return string(resp.Kvs[0].Value)
		}
		tr.add("leader: %s", leader())
		tr.add("proclaim: %s", errName(e1.Proclaim(ctxT(t), "one-again")))
		tr.add("leader after proclaim: %s", leader())
		tr.add("e1 resign: %s", errName(e1.Resign(ctxT(t))))
		select {
		case err := <-second:
			tr.add("e2 campaign returns: %s", errName(err))
		case <-time.After(requestTimeout):
			t.Fatal("e2 never won")
		}
		tr.add("leader after resign: %s", leader())
		var values []string
		timeout := time.After(requestTimeout)
		for len(values) == 0 || values[len(values)-1] != "two" {
			select {
			case resp := <-obs:
				values = append(values, string(resp.Kvs[0].Value))
			case <-timeout:
				t.Fatalf("observe saw %q", values)
			}
		}
		// Observe reports the leader's value whenever it changes; what it saw first depends
		// only on when it started, so only the last value is compared.
		tr.add("observe ends at: %s", values[len(values)-1])
	})
}

func TestSTMDifferential(t *testing.T) {
	differential(t, 1, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		if _, err := cli.Put(ctxT(t), "acct/a", "100"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctxT(t), "acct/b", "0"); err != nil {
			t.Fatal(err)
		}
		// Ten clients move 1 from a to b five times each, concurrently, under serializable STM.
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		for w := 0; w < 10; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 5; i++ {
					_, err := concurrency.NewSTM(cli, func(s concurrency.STM) error {
						var a, b int
						fmt.Sscan(s.Get("acct/a"), &a)
						fmt.Sscan(s.Get("acct/b"), &b)
						s.Put("acct/a", fmt.Sprint(a-1))
						s.Put("acct/b", fmt.Sprint(b+1))
						return nil
					}, concurrency.WithIsolation(concurrency.SerializableSnapshot))
					if err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			tr.add("stm error: %s", errName(err))
		}
		get, err := cli.Get(ctxT(t), "acct/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range get.Kvs {
			tr.add("%s = %s (version %d)", kv.Key, kv.Value, kv.Version)
		}
	})
}
