#!/usr/bin/env bash
# Entry point of a kimi-serve pod in a LeaderWorkerSet group (set as the container command).
#   leader (LWS_WORKER_INDEX=0): wait for every worker's sshd, write a hostfile, mpirun one rank
#                                per pod; rank 0 (here) serves gRPC and metrics.
#   worker:                      run sshd as the kimi user on port 2222 and wait for mpirun.
# Environment from LWS: LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX. SSH keys come from
# the kimi-ssh Secret mounted at /etc/kimi/ssh.
set -euo pipefail
index=${LWS_WORKER_INDEX:-0}
size=${LWS_GROUP_SIZE:-1}
mkdir -p "$HOME/.ssh" "$HOME/sshd"
if [ "$size" -gt 1 ]; then  # ranks in other pods: the keys must be there (a silent miss hung the leader)
  for f in id_ed25519 id_ed25519.pub; do
    if [ ! -r "/etc/kimi/ssh/$f" ]; then
      echo "kimi-launch: /etc/kimi/ssh/$f is missing or unreadable (the kimi-ssh Secret, fsGroup)" >&2
      exit 1
    fi
  done
fi
cp /etc/kimi/ssh/id_ed25519 "$HOME/.ssh/id_ed25519" 2>/dev/null || true
cp /etc/kimi/ssh/id_ed25519.pub "$HOME/.ssh/authorized_keys" 2>/dev/null || true
chmod 700 "$HOME/.ssh"; chmod 600 "$HOME/.ssh/"* 2>/dev/null || true
printf 'Host *\n  Port 2222\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' >"$HOME/.ssh/config"

if [ "$index" != "0" ]; then
  [ -f "$HOME/sshd/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$HOME/sshd/host_key"
  exec /usr/sbin/sshd -D -e -p 2222 -h "$HOME/sshd/host_key" -o PidFile="$HOME/sshd/pid" \
       -o AuthorizedKeysFile="$HOME/.ssh/authorized_keys" -o PasswordAuthentication=no
fi

# Leader: every worker pod is <leader>-<index>.<subdomain>; wait until each accepts ssh.
hosts=("$(hostname -f)")
base=${LWS_LEADER_ADDRESS%%.*}
domain=${LWS_LEADER_ADDRESS#*.}
for ((i = 1; i < size; i++)); do
  host="$base-$i.$domain"
  until ssh -o ConnectTimeout=3 "$host" true 2>/dev/null; do
    echo "waiting for worker $host" >&2
    sleep 2
  done
  hosts+=("$host")
done
printf '%s slots=1\n' "${hosts[@]}" >"$HOME/hostfile"
mpirun --hostfile "$HOME/hostfile" -np "$size" --map-by node \
  --mca plm_rsh_args "-p 2222" \
  kimi-server --config /etc/kimi/config.yaml "$@" &
mpirun_pid=$!
# Pod termination: SIGTERM to rank 0 only. It drains its streams (NOT_SERVING meanwhile), then
# releases the other ranks, and mpirun exits 0; signalling mpirun would abort the job instead.
stop() {
  rank0=$(pgrep -P "$mpirun_pid" -x kimi-server | head -n 1)
  if [ -n "$rank0" ]; then kill -TERM "$rank0"; else kill -TERM "$mpirun_pid"; fi
}
trap stop TERM INT
wait "$mpirun_pid" || true
wait "$mpirun_pid"
