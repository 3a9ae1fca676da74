/**
 * The speaking pipeline (examples/omni.ts: tiny-color-vlm thinks, tiny-talker writes Mimi frames
 * from its hidden states, tiny-mimi plays them) through `cornserve serve` and OpenAI's chat route,
 * against the same app answering text alone, in the same run:
 *
 * - text: the thinker's answer alone (no "audio" in modalities), whole: the baseline.
 * - spoken, streamed: the time to the transcript's first piece (the thinker's text), to the first audio piece,
 *   and to the end; the real-time factor (wall seconds ÷ audio seconds).
 * - spoken, whole: one WAV answer.
 * - 4 concurrent spoken streams: audio seconds made per wall second, against one stream's.
 *
 * What the pipeline costs: the processes of the platform and their resident memory, by role, once
 * the app has answered (the talker is an LLM executor of its own: a router and a worker).
 *
 * Rounds alternate which measure goes first; figures are medians. Prints a table, then (as the last
 * line) one JSON object. Env: BENCH_ROUNDS (default 5).
 */
import { join } from "node:path"
import { repoRoot, runCli } from "../test/support/platform.js"
import { median } from "./support/chat-stream.js"
import { mib, round, withBenchPlatform } from "./support/colorChatPlatform.js"
import { sampleProcesses, taskOnDevice } from "./support/processes.js"

const rounds = Number(process.env.BENCH_ROUNDS ?? 5)
const concurrency = 4
const app = "omni"
const sampleRate = 24_000
const messages = [{ role: "user", content: "Name a colour." }]
const maxTokens = 8

interface Timing {
  readonly seconds: number
  readonly transcriptSeconds?: number
  readonly firstAudioSeconds?: number
  readonly audioSeconds: number
}

export default async function omniBench(): Promise<void> {
  await withBenchPlatform(
    "omni",
    app,
    async (platform) => {
      const registered = await runCli(["app", "register", join(repoRoot, "examples", "omni.ts")], {
        CORNSERVE_GATEWAY_URL: platform.url
      })
      if (registered.code !== 0) throw new Error(`registering omni failed: ${registered.stderr}`)
      const chat = (body: Record<string, unknown>) =>
        fetch(`${platform.url}/app/${app}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ messages, max_tokens: maxTokens, ...body })
        })

      const text = async (): Promise<Timing> => {
        const start = performance.now()
        const response = await chat({})
        if (response.status !== 200) throw new Error(`text: ${response.status} ${await response.text()}`)
        await response.json()
        return { seconds: (performance.now() - start) / 1000, audioSeconds: 0 }
      }

      const streamed = async (): Promise<Timing> => {
        const start = performance.now()
        const response = await chat({
          modalities: ["text", "audio"],
          audio: { voice: "alloy", format: "pcm16" },
          stream: true
        })
        if (response.status !== 200 || response.body === null)
          throw new Error(`streamed: ${response.status} ${await response.text()}`)
        let transcriptSeconds: number | undefined
        let firstAudioSeconds: number | undefined
        let bytes = 0
        let buffered = ""
        const decoder = new TextDecoder()
        for await (const piece of response.body) {
          buffered += decoder.decode(piece as Uint8Array, { stream: true })
          let end = buffered.indexOf("\n\n")
          while (end >= 0) {
            const event = buffered.slice(0, end).trim()
            buffered = buffered.slice(end + 2)
            end = buffered.indexOf("\n\n")
            if (!event.startsWith("data:") || event === "data: [DONE]") continue
            const chunk = JSON.parse(event.slice(5)) as {
              choices: Array<{ delta: { audio?: { transcript?: string; data?: string } } }>
            }
            const audio = chunk.choices[0]?.delta.audio
            const now = (performance.now() - start) / 1000
            if (audio?.transcript) transcriptSeconds ??= now
            if (audio?.data !== undefined) {
              firstAudioSeconds ??= now
              bytes += Buffer.from(audio.data, "base64").length
            }
          }
        }
        return {
          seconds: (performance.now() - start) / 1000,
          ...(transcriptSeconds === undefined ? {} : { transcriptSeconds }),
          ...(firstAudioSeconds === undefined ? {} : { firstAudioSeconds }),
          audioSeconds: bytes / 2 / sampleRate
        }
      }

      const whole = async (): Promise<Timing> => {
        const start = performance.now()
        const response = await chat({ modalities: ["text", "audio"], audio: { voice: "alloy", format: "wav" } })
        const body = (await response.json()) as { choices: Array<{ message: { audio: { data: string } } }> }
        if (response.status !== 200) throw new Error(`whole: ${response.status} ${JSON.stringify(body)}`)
        const wav = Buffer.from(body.choices[0]!.message.audio.data, "base64")
        return { seconds: (performance.now() - start) / 1000, audioSeconds: (wav.length - 44) / 2 / sampleRate }
      }

      // The executors start on their first call: one of each, unmeasured.
      await text()
      await streamed()
      await whole()

      const runs = { text: [] as Array<Timing>, streamed: [] as Array<Timing>, whole: [] as Array<Timing> }
      const concurrentRate: Array<number> = []
      const singleRate: Array<number> = []
      const measures: Array<() => Promise<void>> = [
        async () => void runs.text.push(await text()),
        async () => {
          const one = await streamed()
          runs.streamed.push(one)
          singleRate.push(one.audioSeconds / one.seconds)
        },
        async () => void runs.whole.push(await whole()),
        async () => {
          const start = performance.now()
          const all = await Promise.all(Array.from({ length: concurrency }, () => streamed()))
          const seconds = (performance.now() - start) / 1000
          concurrentRate.push(all.reduce((sum, one) => sum + one.audioSeconds, 0) / seconds)
        }
      ]
      for (let r = 0; r < rounds; r++)
        for (let k = 0; k < measures.length; k++) await measures[(r + k) % measures.length]!()

      const ms = (values: ReadonlyArray<number | undefined>) =>
        round(1000 * median(values.filter((value): value is number => value !== undefined)), 1)
      const textMs = ms(runs.text.map((run) => run.seconds))
      const transcriptMs = ms(runs.streamed.map((run) => run.transcriptSeconds))
      const firstAudioMs = ms(runs.streamed.map((run) => run.firstAudioSeconds))
      const streamedMs = ms(runs.streamed.map((run) => run.seconds))
      const wholeMs = ms(runs.whole.map((run) => run.seconds))
      const audioSeconds = median(runs.streamed.map((run) => run.audioSeconds))
      const rtf = round(streamedMs / 1000 / audioSeconds, 3)
      const single = round(median(singleRate), 2)
      const together = round(median(concurrentRate), 2)

      const samples = sampleProcesses(platform.child.pid!, await taskOnDevice(platform.url), app)
      platform.remember(samples)
      const byRole = new Map<string, { count: number; rssKiB: number }>()
      for (const sample of samples) {
        const role = sample.role.replace(/ \(pid \d+\)/, "")
        const entry = byRole.get(role) ?? { count: 0, rssKiB: 0 }
        entry.count++
        entry.rssKiB += sample.rssKiB
        byRole.set(role, entry)
      }

      console.log(
        `omni: ${rounds} rounds, ${maxTokens} thinker tokens, ${round(audioSeconds, 2)} s of speech an answer`
      )
      console.log("measure                              | median ms | vs text alone")
      console.log(`text alone (thinker)                 | ${textMs} | 1`)
      console.log(`spoken, streamed: transcript         | ${transcriptMs} | ${round(transcriptMs / textMs, 2)}`)
      console.log(`spoken, streamed: first audio        | ${firstAudioMs} | ${round(firstAudioMs / textMs, 2)}`)
      console.log(`spoken, streamed: whole              | ${streamedMs} | ${round(streamedMs / textMs, 2)}`)
      console.log(`spoken, one WAV answer               | ${wholeMs} | ${round(wholeMs / textMs, 2)}`)
      console.log(
        `real-time factor ${rtf} (wall ÷ audio, streamed); audio seconds a wall second: ${single} alone, ${together} with ${concurrency} streams (${round(together / single, 2)}×)`
      )
      console.log("processes                            | count | RSS MiB")
      for (const [role, { count, rssKiB }] of [...byRole].sort(([a], [b]) => a.localeCompare(b)))
        console.log(`${role.padEnd(36)} | ${count} | ${mib(rssKiB)}`)
      console.log(
        JSON.stringify({
          bench: "omni",
          rounds,
          audioSeconds: round(audioSeconds, 2),
          textMs,
          transcriptMs,
          firstAudioMs,
          streamedMs,
          wholeMs,
          firstAudioOverText: round(firstAudioMs / textMs, 2),
          realTimeFactor: rtf,
          audioSecondsPerSecond: { single, concurrent: together, ratio: round(together / single, 2) },
          processes: samples.length,
          rssMiB: mib(samples.reduce((sum, sample) => sum + sample.rssKiB, 0))
        })
      )
    },
    () => undefined,
    { devices: "cpu:0,cpu:1,cpu:2,cpu:3" }
  )
}
