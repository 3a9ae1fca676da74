/**
 * The simulated fleet of the resources bench: 1,000 devices and three dozen tasks (image, video and
 * audio encoders, LLMs of two sizes, image and audio generators), used by 38 apps (text, image,
 * video and audio chats; prompts painted or sung), under a load that is image-heavy, then
 * text-heavy, then generation-heavy, with bursts. The numbers are drawn from a seeded generator, so
 * every run sees the same fleet and the same requests.
 *
 * Service times are batch profiles of the shape the platform's executors show (a fixed cost per
 * batch plus a cost per item, up to a largest batch); targets are two and a half full batches per
 * stage. Rates are scaled so that the heaviest phase, sized at 70% utilisation, needs `load` of the
 * devices (85% by default).
 */
import { capacityOfTask, type LoadPhase, type Scenario, type SimApp, type SimTaskSpec, taskRates } from "./Simulator.js"

const random = (() => {
  let state = 20261123
  return () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0
    return state / 4294967296
  }
})()
const between = (low: number, high: number) => low + (high - low) * random()

const task = (id: string, spec: Omit<SimTaskSpec, "id" | "minExecutors" | "maxExecutors">): SimTaskSpec => ({
  id,
  minExecutors: 1,
  maxExecutors: 10_000,
  ...spec
})

export const fleetScenario = (
  options: { readonly phaseSeconds?: number; readonly seed?: number; readonly load?: number } = {}
): Scenario => {
  const phaseMs = (options.phaseSeconds ?? 300) * 1000
  // Each family: its tasks' count, devices per executor, largest batch, ranges of the cost per
  // batch and per item (drawn per task, in this order), and start-up.
  const families: ReadonlyArray<{
    readonly prefix: string
    readonly count: number
    readonly devices: (index: number) => number
    readonly maxBatch: number
    readonly baseMs: readonly [number, number]
    readonly perItemMs: readonly [number, number]
    readonly startupMs: number
  }> = [
    {
      prefix: "enc-image",
      count: 8,
      devices: () => 1,
      maxBatch: 16,
      baseMs: [30, 50],
      perItemMs: [8, 12],
      startupMs: 10_000
    },
    {
      prefix: "enc-video",
      count: 4,
      devices: () => 1,
      maxBatch: 4,
      baseMs: [80, 120],
      perItemMs: [120, 180],
      startupMs: 10_000
    },
    {
      prefix: "enc-audio",
      count: 4,
      devices: () => 1,
      maxBatch: 16,
      baseMs: [15, 25],
      perItemMs: [5, 7],
      startupMs: 10_000
    },
    {
      prefix: "llm",
      count: 10,
      devices: (i) => (i < 6 ? 2 : 4),
      maxBatch: 32,
      baseMs: [1500, 2500],
      perItemMs: [90, 150],
      startupMs: 30_000
    },
    {
      prefix: "gen-image",
      count: 6,
      devices: () => 1,
      maxBatch: 4,
      baseMs: [600, 1000],
      perItemMs: [450, 750],
      startupMs: 20_000
    },
    {
      prefix: "gen-audio",
      count: 4,
      devices: () => 1,
      maxBatch: 8,
      baseMs: [250, 350],
      perItemMs: [80, 120],
      startupMs: 20_000
    }
  ]
  const tasks: Array<SimTaskSpec> = []
  for (const family of families)
    for (let i = 0; i < family.count; i++)
      tasks.push(
        task(`${family.prefix}-${i}`, {
          devicesPerExecutor: family.devices(i),
          maxBatch: family.maxBatch,
          baseMs: between(...family.baseMs),
          perItemMs: between(...family.perItemMs),
          startupMs: family.startupMs
        })
      )

  const fullBatchMs = new Map(tasks.map((spec) => [spec.id, spec.baseMs + spec.perItemMs * spec.maxBatch]))
  const app = (id: string, stages: ReadonlyArray<string>): SimApp => ({
    id,
    stages,
    targetMs: Math.round(stages.reduce((sum, stage) => sum + 2.5 * fullBatchMs.get(stage)!, 0))
  })
  const apps: Array<SimApp> = []
  const groups = new Map<string, "image" | "text" | "generation" | "audio">()
  const add = (entry: SimApp, group: "image" | "text" | "generation" | "audio") => {
    apps.push(entry)
    groups.set(entry.id, group)
  }
  for (let j = 0; j < 10; j++) add(app(`text-${j}`, [`llm-${j}`]), "text")
  for (let j = 0; j < 10; j++) add(app(`image-${j}`, [`enc-image-${j % 8}`, `llm-${j}`]), "image")
  for (let j = 0; j < 4; j++) add(app(`video-${j}`, [`enc-video-${j}`, `llm-${j + 2}`]), "image")
  for (let j = 0; j < 4; j++) add(app(`audio-${j}`, [`enc-audio-${j}`, `llm-${j * 2}`]), "audio")
  for (let j = 0; j < 6; j++) add(app(`paint-${j}`, [`llm-${j}`, `gen-image-${j}`]), "generation")
  for (let j = 0; j < 4; j++) add(app(`sing-${j}`, [`llm-${j + 6}`, `gen-audio-${j}`]), "generation")

  const base = new Map(apps.map((entry) => [entry.id, between(0.5, 1.5)]))
  const heavy = ["image", "text", "generation"] as const
  const phaseAt = (scale: number): Array<LoadPhase> =>
    heavy.map((group) => ({
      name: `${group}-heavy`,
      durationMs: phaseMs,
      rates: Object.fromEntries(
        apps.map((entry) => [entry.id, scale * base.get(entry.id)! * (groups.get(entry.id) === group ? 4 : 1)])
      ),
      // Three bursts a phase: one app at three times its rate for a tenth of the phase.
      bursts: [0, 1, 2].map((burst) => ({
        app: apps[Math.floor(between(0, apps.length))]!.id,
        atMs: Math.round(((burst + 0.5 + between(-0.3, 0.3)) * phaseMs) / 3.5),
        durationMs: Math.round(phaseMs / 10),
        factor: 3
      }))
    }))

  const scenarioAt = (scale: number): Scenario => ({
    devices: 1000,
    tasks,
    apps,
    phases: phaseAt(scale),
    queuePerExecutor: 64,
    seed: options.seed ?? 7
  })
  const demand = (scenario: Scenario) =>
    Math.max(
      ...scenario.phases.map((phase) => {
        const rates = taskRates(scenario, phase)
        return tasks.reduce(
          (sum, spec) => sum + Math.ceil(rates.get(spec.id)! / (capacityOfTask(spec) * 0.7)) * spec.devicesPerExecutor,
          0
        )
      })
    )
  let [low, high] = [0.01, 100]
  for (let i = 0; i < 50; i++) {
    const middle = (low + high) / 2
    if (demand(scenarioAt(middle)) <= 1000 * (options.load ?? 0.85)) low = middle
    else high = middle
  }
  return scenarioAt(low)
}
