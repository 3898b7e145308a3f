# Sourced by the project's shell scripts and tests: wait for a condition, never for a time.
#
#   wait_until SECONDS WHAT COMMAND [ARG...]
#
# Runs COMMAND every 50 ms until it succeeds (returns 0 then). After SECONDS, but never fewer
# than $KNOD_MIN_WAIT_S (default 60: a neighbour's load makes these machines ten times slower,
# and a condition that holds ends the wait at once), prints "timed out after N s waiting for
# WHAT" on stderr and returns 1. COMMAND is run as given (use `bash -c '...'` for a pipeline).
wait_until() {
    local seconds=$1 what=$2
    shift 2
    local floor=${KNOD_MIN_WAIT_S:-60}
    [ "$seconds" -ge "$floor" ] 2>/dev/null || seconds=$floor
    local end=$((SECONDS + seconds))
    while :; do
        "$@" && return 0
        if [ "$SECONDS" -ge "$end" ]; then
            echo "timed out after $seconds s waiting for $what" >&2
            return 1
        fi
        sleep 0.05
    done
}
