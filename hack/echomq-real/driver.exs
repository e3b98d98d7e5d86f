# Our driver for the real EchoMQ (hack/echomq-real/run.sh runs it; see README.md).
#
# Runs K real EchoMQ.Consumer processes (standalone loop: reap, promote, drain,
# park) under one Supervisor on one queue, enqueues a trickle of healthy jobs
# into a few lanes plus ONE poison job, and records every claim the handlers
# see. The handler completes healthy jobs; on the poison job it kills its own
# consumer process (an untrappable :kill, as an OOM killer would), so the lease
# is abandoned and the supervisor restarts the consumer on a fresh connector.
#
# Only EchoMQ's public API is called (Connector, Lanes.enqueue, Consumer).
# Ends when the poison id is in emq:{Q}:dead, or `--bound` seconds after the
# poison was enqueued. Writes one line per event to `--out`:
#   ENQ   <t_us> <id> <kind> <lane>
#   CLAIM <t_us> <id> <attempts> <kind> <consumer pid>
#   EXT   <t_us> <id> <attempts> <result>   (a slow job's lease extension)
#   PAUSE <t_us stopped> <t_us continued> <held score>   (--pause-pid: the sweeper stopped)
#   END   <t_us> <outcome morgue|bound> <poison enqueued t_us> <morgue seen t_us or -1>
# t_us is the host's os clock in microseconds (the same host as the server).

{opts, _, _} =
  OptionParser.parse(System.argv(),
    strict: [
      port: :integer, queue: :string, k: :integer, bound: :float, rate: :float,
      poison_after_ms: :integer, lanes: :integer, lease_ms: :integer, beat_ms: :integer,
      out: :string, drain_s: :float, slow_every: :integer, extend_at_ms: :integer, extensions: :integer,
      pause_pid: :integer, pause_at: :integer, pause_ms: :integer
    ]
  )

port = Keyword.fetch!(opts, :port)
queue = Keyword.fetch!(opts, :queue)
k = Keyword.get(opts, :k, 2)
bound_ms = round(Keyword.get(opts, :bound, 60.0) * 1000)
rate = Keyword.get(opts, :rate, 5.0)
poison_after = Keyword.get(opts, :poison_after_ms, 1500)
lane_count = Keyword.get(opts, :lanes, 3)
lease_ms = Keyword.get(opts, :lease_ms, 2_000)
beat_ms = Keyword.get(opts, :beat_ms, 1_000)
drain_ms = round(Keyword.get(opts, :drain_s, 5.0) * 1000)
out = Keyword.fetch!(opts, :out)
# every Nth healthy job is slow (0: none): it extends its lease `extensions`
# times, `extend_at_ms` after the claim and after each extension (EchoMQ's
# public Jobs.extend_lock), then completes; 1880 ms of a 2 s lease lands each
# extension inside the last 250 ms, where our sweep holds a lapsing lease
slow_every = Keyword.get(opts, :slow_every, 0)
extend_at = Keyword.get(opts, :extend_at_ms, 1_880)
extensions = Keyword.get(opts, :extensions, 3)
# --pause-pid: the sweeper's pid. When our sweep holds the poison's lease for the
# `pause_at`-th time (a score with a half), stop the sweeper (SIGSTOP) for
# `pause_ms`, past the hold's end (D + 1000.5): EchoMQ's reapers then return the
# job uncounted, and the sweeper, continued, should report the lapse uncounted
pause_pid = Keyword.get(opts, :pause_pid)
pause_at = Keyword.get(opts, :pause_at, 2)
pause_ms = Keyword.get(opts, :pause_ms, 1_600)

Logger.configure(level: :warning)
:ok = EchoData.Snowflake.start()

now_us = fn -> System.os_time(:microsecond) end
{:ok, log} = File.open(out, [:write, :utf8])
put = fn line -> IO.write(log, line <> "\n") end

{:ok, conn} = EchoMQ.Connector.start_link(port: port)
lanes = for _ <- 1..lane_count, do: EchoData.BrandedId.generate!("GRP")

recorder = self()

handler = fn %{id: id, payload: payload, attempts: att} ->
  send(recorder, {:claim, now_us.(), id, att, payload, self()})

  if payload == "poison" do
    # the worker dies holding the lease: no complete, no retry, no extension
    Process.exit(self(), :kill)
  end

  if payload == "slow" do
    for _ <- 1..extensions do
      Process.sleep(extend_at)
      result = EchoMQ.Jobs.extend_lock(conn, queue, id, att, lease_ms)
      send(recorder, {:ext, now_us.(), id, att, result})
    end
  end

  :ok
end

children =
  for i <- 1..k do
    Supervisor.child_spec(
      {EchoMQ.Consumer,
       [queue: queue, handler: handler, connector: [port: port], lease_ms: lease_ms, beat_ms: beat_ms]},
      id: {:consumer, i}
    )
  end

# A generous restart intensity: the poison job restarts a consumer per claim,
# and we measure the cap, not the supervision tree (see the wire contract).
{:ok, sup} = Supervisor.start_link(children, strategy: :one_for_one, max_restarts: 1_000_000, max_seconds: 1)

dead_key = EchoMQ.Keyspace.queue_key(queue, "dead")
active_key = EchoMQ.Keyspace.queue_key(queue, "active")

defmodule Pause do
  # poll the poison's score in active every 2 ms on a connector of our own
  def watch(port, active_key, id, pid, pause_at, pause_ms, recorder) do
    {:ok, c} = EchoMQ.Connector.start_link(port: port)
    loop(c, active_key, id, pid, pause_at, pause_ms, recorder, nil, 0)
  end

  # RESP3 answers ZSCORE with a double, RESP2 with a string
  defp held?(nil), do: false
  defp held?(score) when is_float(score), do: score != Float.floor(score)
  defp held?(score) when is_integer(score), do: false
  defp held?(score) when is_binary(score), do: held?(elem(Float.parse(score), 0))

  defp loop(c, key, id, pid, at, ms, rec, last, n) do
    {:ok, score} = EchoMQ.Connector.command(c, ["ZSCORE", key, id])
    held = held?(score)
    cond do
      held and score != last and n + 1 == at ->
        t_stop = System.os_time(:microsecond)
        System.cmd("kill", ["-STOP", Integer.to_string(pid)])
        Process.sleep(ms)
        System.cmd("kill", ["-CONT", Integer.to_string(pid)])
        send(rec, {:pause, t_stop, System.os_time(:microsecond), score})

      held and score != last ->
        Process.sleep(2)
        loop(c, key, id, pid, at, ms, rec, score, n + 1)

      true ->
        Process.sleep(2)
        loop(c, key, id, pid, at, ms, rec, last, n)
    end
  end
end
t0 = System.monotonic_time(:millisecond)
gap = max(1, round(1000 / rate))

defmodule Drive do
  def record_claims(put) do
    receive do
      {:claim, t, id, att, payload, pid} ->
        kind = if payload == "poison", do: "poison", else: "healthy"
        kind = if payload == "slow", do: "slow", else: kind
        put.("CLAIM #{t} #{id} #{att} #{kind} #{inspect(pid)}")
        record_claims(put)

      {:pause, t_stop, t_cont, score} ->
        put.("PAUSE #{t_stop} #{t_cont} #{score}")
        record_claims(put)

      {:ext, t, id, att, result} ->
        put.("EXT #{t} #{id} #{att} #{inspect(result) |> String.replace(" ", "")}")
        record_claims(put)
    after
      0 -> :ok
    end
  end
end

enqueue = fn kind, lane_i ->
  id = EchoData.BrandedId.generate!("JOB")
  lane = Enum.at(lanes, rem(lane_i, length(lanes)))
  t = now_us.()
  payload = %{poison: "poison", slow: "slow", healthy: "ok"}[kind]
  {:ok, :enqueued} = EchoMQ.Lanes.enqueue(conn, queue, lane, id, payload)
  put.("ENQ #{t} #{id} #{kind} #{lane}")
  {id, t}
end

# the main loop: one healthy job every `gap` ms, the poison once, poll the morgue
loop = fn loop, n, next_job, poison ->
  Drive.record_claims(put)
  now = System.monotonic_time(:millisecond) - t0

  {n, next_job} =
    if now >= next_job do
      enqueue.(if(slow_every > 0 and rem(n + 1, slow_every) == 0, do: :slow, else: :healthy), n)
      {n + 1, next_job + gap}
    else
      {n, next_job}
    end

  poison =
    if poison == nil and now >= poison_after do
      {id, t} = enqueue.(:poison, 0)
      if pause_pid, do: spawn_link(fn -> Pause.watch(port, active_key, id, pause_pid, pause_at, pause_ms, recorder) end)
      {id, t, now}
    else
      poison
    end

  case poison do
    nil ->
      Process.sleep(min(20, max(0, next_job - now)))
      loop.(loop, n, next_job, poison)

    {id, t_enq, at} ->
      case EchoMQ.Connector.command(conn, ["ZSCORE", dead_key, id]) do
        {:ok, nil} ->
          if now - at >= bound_ms do
            {:bound, id, t_enq, -1}
          else
            Process.sleep(min(20, max(0, next_job - now)))
            loop.(loop, n, next_job, poison)
          end

        {:ok, _} ->
          {:morgue, id, t_enq, now_us.()}
      end
  end
end

{outcome, _poison_id, t_enq, t_dead} = loop.(loop, 0, 0, nil)

# stop the trickle; let the consumers finish the healthy jobs in the lanes
lane_keys = Enum.map(lanes, fn g -> EchoMQ.Keyspace.queue_key(queue, "g:" <> g <> ":pending") end)

drain = fn drain, left ->
  Drive.record_claims(put)
  {:ok, sizes} = EchoMQ.Connector.pipeline(conn, Enum.map(lane_keys, &["ZCARD", &1]) ++ [["ZCARD", active_key]])
  # the poison, if it still cycles, may sit in a lane or in active
  if Enum.sum(sizes) <= (if outcome == :bound, do: 1, else: 0) or left <= 0 do
    :ok
  else
    Process.sleep(50)
    drain.(drain, left - 50)
  end
end

drain.(drain, drain_ms)
# the script is linked to the supervisor: unlink, or its :shutdown would end us too
Process.unlink(sup)
Supervisor.stop(sup, :shutdown, 10_000)
Drive.record_claims(put)
put.("END #{now_us.()} #{outcome} #{t_enq} #{t_dead}")
File.close(log)
IO.puts("driver: K=#{k} #{outcome}")
