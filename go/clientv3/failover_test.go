package clientv3diff

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Writes sent to the survivors right after the leader dies: etcd holds a proposal until a
// leader takes it (the one that went to the dead leader times out), and so must leasehold;
// answering "no leader" at once fails every one of them, as clientv3 does not send a Put again
// once it reached a server. kube-apiserver turns each such failure into an HTTP 500.
func TestWritesWaitForTheNextLeader(t *testing.T) {
	differential(t, 3, func(t *testing.T, c *cluster, tr *transcript) {
		leader := c.leader(t)
		var survivors []*member
		for _, m := range c.members {
			if m != leader {
				survivors = append(survivors, m)
			}
		}
		cli := c.memberClient(t, survivors[0])
		if _, err := cli.Put(ctxT(t), "elect/warm", "v"); err != nil {
			t.Fatal(err)
		}
		leader.kill()
		const puts = 20
		failed := 0
		for i := 0; i < puts; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			_, err := cli.Put(ctx, fmt.Sprintf("elect/%02d", i), "v")
			cancel()
			if err != nil {
				failed++
				t.Logf("put %d: %v", i, err)
			}
		}
		tr.add("at most one of %d puts sent during the election failed: %t", puts, failed <= 1)
		get, err := cli.Get(ctxT(t), "elect/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		tr.add("keys written: %s at least %d: %t", errName(err), puts-1, get.Count >= puts-1)
	})
}

// The leader dies while a client keeps a lease alive over KeepAlive: the client's stream moves
// to a surviving member and the lease, with its key, outlives the deadline it had at the kill.
func TestKeepAliveSurvivesLeaderKill(t *testing.T) {
	differential(t, 3, func(t *testing.T, c *cluster, tr *transcript) {
		cli := c.client(t)
		const ttlSeconds = 4
		grant, err := cli.Grant(ctxT(t), ttlSeconds)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctxT(t), "ka/k", "v", clientv3.WithLease(grant.ID)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := cli.KeepAlive(ctx, grant.ID)
		if err != nil {
			t.Fatal(err)
		}
		<-ch
		c.leader(t).kill()
		killed := time.Now()
		// Past twice the TTL from the kill, counting renewals that arrived after it.
		after := 0
		limit := time.After(2 * ttlSeconds * time.Second)
	wait:
		for {
			select {
			case ka, ok := <-ch:
				if !ok {
					t.Fatalf("the keepalive channel closed %s after the kill", time.Since(killed))
				}
				if ka.TTL > 0 {
					after++
				}
			case <-limit:
				break wait
			}
		}
		tr.add("renewals after the kill: %t", after > 0)
		get, err := cli.Get(ctxT(t), "ka/k")
		tr.add("key after twice the TTL: %s count %d", errName(err), get.Count)
		ttl, err := cli.TimeToLive(ctxT(t), grant.ID)
		tr.add("lease alive: %s %t", errName(err), ttl.TTL > 0)
	})
}
