import { Fragment } from "preact"
import { useState } from "preact/hooks"
import type { NodeListJson, TaskListJson, TaskProfileJson } from "../../../src/control/gateway/GatewayAnswers"
import { getJson, type Refusal } from "../api"
import { formatMs, RefusalNotice, usePolling } from "../components"
import { LineChart, type Series } from "../LineChart"

type NodeListing = NodeListJson["nodes"][number]
type ProfileSummary = Pick<TaskProfileJson, "calls" | "failed" | "recent" | "queueDepth" | "curves">
type TaskProfile = TaskProfileJson

/** A profile's latency by load: p50 and p99 for each executor count. */
const latencyCurves = (profile: ProfileSummary): Array<Series> =>
  profile.curves.flatMap((curve) =>
    (["p50Ms", "p99Ms"] as const).map((field) => ({
      name: `${field.slice(0, 3)}, ${curve.executors} executor${curve.executors === 1 ? "" : "s"}`,
      points: curve.points.map((point) => [point.meanLevel, point[field]] as const)
    }))
  )

const throughputCurves = (profile: ProfileSummary): Array<Series> =>
  profile.curves.map((curve) => ({
    name: `${curve.executors} executor${curve.executors === 1 ? "" : "s"}`,
    points: curve.points.map((point) => [point.meanLevel, point.callsPerSecond] as const)
  }))

const level = (x: number) => `${x.toFixed(x < 10 ? 1 : 0)} in flight`

const ProfileCharts = ({ taskId }: { readonly taskId: string }) => {
  const [profile, setProfile] = useState<TaskProfile | undefined>(undefined)
  const [refusal, setRefusal] = useState<Refusal | undefined>(undefined)
  usePolling(
    async (signal) => {
      const answer = await getJson<TaskProfile>(`/tasks/${encodeURIComponent(taskId)}/profile`, "none", signal)
      if (signal.aborted) return
      if (!answer.ok) return setRefusal(answer.refusal)
      setRefusal(undefined)
      setProfile(answer.value)
    },
    5000,
    taskId
  )
  if (refusal !== undefined) return <RefusalNotice refusal={refusal} />
  if (profile === undefined) return <p>Loading the profile…</p>
  const recent = profile.recent
  return (
    <div class="profile" data-task={taskId}>
      <p class="stats">
        {profile.calls} calls ({profile.failed} failed); last {recent.windowSeconds} s:{" "}
        {recent.callsPerSecond.toFixed(2)} calls/s
        {recent.p50Ms !== null && `, p50 ${formatMs(recent.p50Ms)}`}
        {recent.p99Ms !== null && `, p99 ${formatMs(recent.p99Ms)}`}; executor queue depth mean{" "}
        {profile.queueDepth.mean.toFixed(1)}, max {profile.queueDepth.max}
      </p>
      <div class="charts">
        <LineChart
          title="Latency by load (measured)"
          series={latencyCurves(profile)}
          formatX={level}
          formatY={formatMs}
          empty="no calls measured yet"
        />
        <LineChart
          title="Calls per second by load (measured)"
          series={throughputCurves(profile)}
          formatX={level}
          formatY={(y) => y.toFixed(y < 10 ? 1 : 0)}
          empty="no calls measured yet"
        />
        {profile.recorded !== null && (
          <LineChart
            title={`Latency by load (recorded ${new Date(profile.recorded.recordedAt).toLocaleString()})`}
            series={latencyCurves(profile.recorded)}
            formatX={level}
            formatY={formatMs}
          />
        )}
      </div>
    </div>
  )
}

export const TasksPage = () => {
  const [tasks, setTasks] = useState<TaskListJson>()
  const [nodes, setNodes] = useState<ReadonlyArray<NodeListing>>()
  const [refusal, setRefusal] = useState<Refusal | undefined>(undefined)
  /** The task whose profile is shown; "" once the reader closed it. */
  const [open, setOpen] = useState<string | undefined>(undefined)
  usePolling(async (signal) => {
    const [taskList, nodeList] = await Promise.all([
      getJson<TaskListJson>("/tasks/list", "none", signal),
      getJson<NodeListJson>("/nodes/list", "none", signal)
    ])
    if (signal.aborted) return
    if (!taskList.ok) return setRefusal(taskList.refusal)
    if (!nodeList.ok) return setRefusal(nodeList.refusal)
    setRefusal(undefined)
    setTasks(taskList.value)
    setNodes(nodeList.value.nodes)
    // The LLM's profile is open at first: the task most apps share, and the one whose curves say most.
    setOpen(
      (current) => current ?? (taskList.value.tasks.find((task) => task.kind === "llm") ?? taskList.value.tasks[0])?.id
    )
  }, 3000)
  const nameOf = (taskId: string) => tasks?.tasks.find((task) => task.id === taskId)?.name ?? taskId
  return (
    <div class="page tasks">
      {refusal !== undefined && <RefusalNotice refusal={refusal} />}
      <section class="panel">
        <h2>Tasks</h2>
        {tasks === undefined ? (
          <p>Loading…</p>
        ) : tasks.tasks.length === 0 ? (
          <p>No task is deployed: an app's tasks are deployed when it registers.</p>
        ) : (
          <table class="tasks-table">
            <thead>
              <tr>
                <th>Task</th>
                <th>Kind</th>
                <th>State</th>
                <th>Used by</th>
                <th>Devices</th>
                <th>Executors</th>
                <th />
              </tr>
            </thead>
            <tbody>
              {tasks.tasks.map((task) => (
                <Fragment key={task.id}>
                  <tr data-task={task.id}>
                    <td>
                      <strong>{task.name}</strong>
                      <div class="description">{task.id}</div>
                    </td>
                    <td>{task.kind}</td>
                    <td>
                      <span class={`state state-${task.state}`}>{task.state}</span>
                    </td>
                    <td>{task.usedBy.join(", ") || "—"}</td>
                    <td>{task.devices.join(", ") || "—"}</td>
                    <td>
                      {task.executors.map((executor) => (
                        <div key={executor.id} class={executor.healthy ? "healthy" : "unhealthy"}>
                          {executor.healthy ? "● " : "○ "}
                          {executor.id} on {executor.node}
                        </div>
                      ))}
                    </td>
                    <td>
                      <button type="button" onClick={() => setOpen(open === task.id ? "" : task.id)}>
                        {open === task.id ? "Hide profile" : "Profile"}
                      </button>
                    </td>
                  </tr>
                  {open === task.id && (
                    <tr>
                      <td colSpan={7}>
                        <ProfileCharts taskId={task.id} />
                      </td>
                    </tr>
                  )}
                </Fragment>
              ))}
            </tbody>
          </table>
        )}
      </section>
      <section class="panel">
        <h2>Devices</h2>
        {tasks !== undefined && (
          <table class="devices-table">
            <thead>
              <tr>
                <th>Device</th>
                <th>Type</th>
                <th>Threads</th>
                <th>Tasks sharing it</th>
              </tr>
            </thead>
            <tbody>
              {tasks.devices.map((device) => (
                <tr key={device.id} data-device={device.id}>
                  <td>{device.id}</td>
                  <td>{device.type}</td>
                  <td class="number">{device.threads}</td>
                  <td class={device.tasks.length > 1 ? "shared" : ""}>
                    {device.tasks.length === 0 ? "free" : device.tasks.map(nameOf).join(", ")}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </section>
      <section class="panel">
        <h2>Nodes</h2>
        {nodes !== undefined && (
          <table class="nodes-table">
            <thead>
              <tr>
                <th>Node</th>
                <th>Role</th>
                <th>Address</th>
                <th>State</th>
                <th>Devices</th>
              </tr>
            </thead>
            <tbody>
              {nodes.map((node) => (
                <tr key={node.name} data-node={node.name}>
                  <td>{node.name}</td>
                  <td>{node.role}</td>
                  <td>{node.address}</td>
                  <td>
                    <span class={`state state-${node.state}`}>{node.state}</span>
                  </td>
                  <td>
                    {node.devices.map((device) => (
                      <div key={device.id}>
                        {device.id}:{" "}
                        {(device.tasks ?? (device.task === null ? [] : [device.task])).map(nameOf).join(", ") || "free"}
                      </div>
                    ))}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </section>
    </div>
  )
}
