-- wrk script: the non-streaming chat request of `fastroute bench-e2e`, for
-- cross-checking any front end with wrk:
--   wrk -t1 -c64 -d5s -s bench/wrk-chat.lua http://127.0.0.1:8000/v1/chat/completions
wrk.method = "POST"
wrk.body = '{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"
