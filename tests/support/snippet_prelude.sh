# Sourced by bash before a doc snippet runs (tests/tools/test_snippets.py):
# the commands a snippet names that can't run here to the end become
# functions, so the snippet's text stays as written. What they record goes
# to $SNIPPET_OUT/records.jsonl (one JSON object a line: argv, env), which
# the test then checks with the right parser.
set -eo pipefail

snippet_record() {
    "$SNIPPET_PYTHON" -c 'import json, os, sys
with open(os.path.join(os.environ["SNIPPET_OUT"], "records.jsonl"), "a") as f:
    record = {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}
    f.write(json.dumps(record) + "\n")' "$@"
}

# gdrkv serve ...: the real server, in the background; returns once it
# listens. The kernel kills it if this shell dies (setpriv --pdeathsig);
# on a normal exit the trap below stops it with SIGTERM and records how it
# exited. gdrkv bench and doctor measure and probe the hardware the docs
# describe: recorded, their arguments checked by gdrkv's parser. Anything
# else is the real command.
SNIPPET_SERVERS=()
gdrkv() {
    case ${1-} in
    serve)
        local n=${#SNIPPET_SERVERS[@]} deadline=$((SECONDS + 60))
        local out=$SNIPPET_OUT/serve-$n.out
        setpriv --pdeathsig KILL -- "$SNIPPET_GDRKV" "$@" >"$out" 2>"$SNIPPET_OUT/serve-$n.log" &
        SNIPPET_SERVERS+=($!)
        until grep -q '^gdrkv listening on' "$out"; do
            if ! kill -0 $! 2>/dev/null || [ $SECONDS -gt $deadline ]; then
                echo "gdrkv serve did not start:" >&2
                cat "$SNIPPET_OUT/serve-$n.log" >&2
                return 1
            fi
            sleep 0.05
        done ;;
    bench | doctor) snippet_record gdrkv "$@" ;;
    *) "$SNIPPET_GDRKV" "$@" ;;
    esac
}
snippet_stop_servers() {
    local pid rc
    for pid in "${SNIPPET_SERVERS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
        rc=0; wait "$pid" || rc=$?
        echo "$rc" >>"$SNIPPET_OUT/serve-exits"
    done
}
trap snippet_stop_servers EXIT

# The engines: recorded with the environment they would start in.
vllm() { snippet_record vllm "$@"; }
python() {
    if [ "${1-} ${2-}" = "-m sglang.launch_server" ]; then
        snippet_record python "$@"
    else
        command python "$@"
    fi
}

# bash tests/*.sh: the CI's own scripts (tests/run.sh installs and runs
# everything, the engines' installers included): recorded and checked to
# parse; run.sh can't run inside the suite it runs.
bash() {
    case ${1-} in
    tests/*.sh) snippet_record bash "$@" ;;
    *) command bash "$@" ;;
    esac
}
export -f snippet_record gdrkv
