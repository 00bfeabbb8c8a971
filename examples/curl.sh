#!/bin/sh
# Tollgate over plain HTTP: a synchronous call, an async job, and the balance.
# Needs only sh and curl (plus python3 or node to read JSON).
#   TOLLGATE_URL=http://localhost:8080 TOLLGATE_KEY=cv_... sh examples/curl.sh
set -eu

: "${TOLLGATE_URL:?set TOLLGATE_URL, e.g. http://localhost:8080}"
: "${TOLLGATE_KEY:?set TOLLGATE_KEY to an API key (cv_...)}"
BASE=${TOLLGATE_URL%/}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# get FILE PATH: prints the member at PATH (dot-separated, e.g. result.value) of the JSON in FILE.
if command -v python3 >/dev/null 2>&1; then
  get() {
    python3 -c '
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v.get(k) if isinstance(v, dict) else None
print("" if v is None else v if isinstance(v, str) else json.dumps(v))
' "$1" "$2"
  }
elif command -v node >/dev/null 2>&1; then
  get() {
    node -e '
let v = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
for (const k of process.argv[2].split(".")) v = v !== null && typeof v === "object" ? v[k] : undefined;
console.log(v === undefined || v === null ? "" : typeof v === "string" ? v : JSON.stringify(v));
' "$1" "$2"
  }
else
  fail "python3 or node is needed to read JSON"
fi

# request METHOD PATH [BODY] [EXTRA HEADER]: writes the body to $TMP/body and prints the HTTP status.
request() {
  if [ -n "${3:-}" ]; then
    curl -sS -o "$TMP/body" -w '%{http_code}' -X "$1" "$BASE$2" \
      -H "Authorization: Bearer $TOLLGATE_KEY" -H 'Content-Type: application/json' \
      ${4:+-H "$4"} --data "$3"
  else
    curl -sS -o "$TMP/body" -w '%{http_code}' -X "$1" "$BASE$2" -H "Authorization: Bearer $TOLLGATE_KEY"
  fi
}

# 1. A synchronous call: the service runs the job and answers 200 with the result and its cost.
status=$(request POST /tools/compute '{"expression": "6 * 7"}') || fail "cannot reach $BASE"
[ "$status" = 200 ] || fail "POST /tools/compute answered $status: $(cat "$TMP/body")"
echo "sync: 6 * 7 = $(get "$TMP/body" result.value) (cost $(get "$TMP/body" cost_cents) cents, $(get "$TMP/body" remaining_credits) credits left)"

# 2. An async job: Prefer: respond-async answers 202 with a job id at once; GET /jobs/{id} until it ends.
status=$(request POST /tools/compute '{"expression": "sqrt(2)"}' 'Prefer: respond-async')
[ "$status" = 202 ] || fail "POST /tools/compute with Prefer: respond-async answered $status: $(cat "$TMP/body")"
job=$(get "$TMP/body" job_id)
echo "async: job $job $(get "$TMP/body" status)"
tries=0
while :; do
  status=$(request GET "/jobs/$job")
  [ "$status" = 200 ] || fail "GET /jobs/$job answered $status: $(cat "$TMP/body")"
  state=$(get "$TMP/body" status)
  case $state in
    queued | running) ;;
    completed) break ;;
    *) fail "job $job ended as $state: $(cat "$TMP/body")" ;;
  esac
  tries=$((tries + 1))
  [ "$tries" -lt 120 ] || fail "job $job still $state after 60 s"
  sleep 0.5
done
echo "async: job $job completed: sqrt(2) = $(get "$TMP/body" result.value) (cost $(get "$TMP/body" cost_cents) cents)"

# 3. The balance: credits are cents.
status=$(request GET /balance)
[ "$status" = 200 ] || fail "GET /balance answered $status: $(cat "$TMP/body")"
echo "balance: $(get "$TMP/body" credits) credits on plan $(get "$TMP/body" plan)"
