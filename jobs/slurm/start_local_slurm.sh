#!/usr/bin/env bash
# Starts a single-node Slurm (slurmctld + slurmd + munge) on localhost, as root, when none answers.
# For testing the batch scripts on one machine (Debian 12, slurm-wlm 22.05). Idempotent.
# Needs the packages slurm-wlm and munge (scripts/setup.sh installs them). Exit 0 when the node is up.
set -euo pipefail
if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then exit 0; fi
[ "$(id -u)" -eq 0 ] || { echo "start_local_slurm: needs root" >&2; exit 1; }
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 2048 ))
mkdir -p /run/munge /var/spool/slurmd /var/spool/slurmctld /var/log/slurm /etc/slurm
chown munge:munge /run/munge && chmod 755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
fi
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged
# Whole node in one partition; tasks may share cores (tests oversubscribe on purpose: srun -O).
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=hcplocal
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
# A state directory from another cluster name makes slurmctld exit.
pgrep -x slurmctld >/dev/null || { rm -f /var/spool/slurmctld/clustername; /usr/sbin/slurmctld; }
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 1 30); do
  sinfo -h -o %T 2>/dev/null | grep -qE '^idle' && { sinfo; exit 0; }
  sleep 1
done
echo "start_local_slurm: the node did not become idle in 30 s (see /var/log/slurm/)" >&2
exit 1
