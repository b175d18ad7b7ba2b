# Sourced by the bench scripts.
# free_port: a loopback port below the kernel's ephemeral range (which outbound connections draw
# their local ports from, so none can take it between this check and the server's bind) that
# binds right now.
free_port() { python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    p = random.randrange(10000, low); s = socket.socket()
    try: s.bind(("127.0.0.1", p)); print(p); break
    except OSError: pass
    finally: s.close()'; }
