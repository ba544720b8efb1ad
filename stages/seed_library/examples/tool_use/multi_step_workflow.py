# spade: domain=tool_use skill=multi-step-workflow
class OrderPipelineEnv(ToolUseBaseEnv):
    max_turns = 16

    def setup(self):
        r = self.rng
        after = {"paid": "packed", "packed": "labelled", "labelled": "shipped"}
        orders = {f"O{n}": r.choice(["paid", "packed"]) for n in r.sample(range(1000, 10000), 3)}
        self.state = {"orders": orders, "after": after}
        self.tools = {
            "get_order": {"description": "Stage of an order.", "parameters": {
                "type": "object", "properties": {"order_id": {"type": "string"}}}},
            "set_stage": {"description": "Move an order to its next stage.", "parameters": {
                "type": "object", "properties": {
                    "order_id": {"type": "string"},
                    "stage": {"type": "string", "enum": ["packed", "labelled", "shipped"]}}}},
            "returns": {"description": "Return policy.", "parameters": {
                "type": "object", "properties": {}}},
        }
        self.instructions = [f"Get order {o} shipped." for o in orders]
        self.criteria = [lambda s, o=o: s["orders"][o] == "shipped" for o in orders]

    def tool_get_order(self, order_id):
        return self.state["orders"].get(order_id, "Error: unknown order.")

    def tool_set_stage(self, order_id, stage):
        now = self.state["orders"].get(order_id, "unknown")
        if self.state["after"].get(now) != stage:
            return f"Error: {order_id} is {now}; stages go paid > packed > labelled > shipped."
        self.state["orders"][order_id] = stage
        return f"{order_id} is {stage}."

    def tool_returns(self):
        return "Free returns within 30 days."

    def solution(self):
        acts = []
        for o, now in self.state["orders"].items():
            while now != "shipped":
                now = self.state["after"][now]
                acts.append(self.call("set_stage", order_id=o, stage=now))
        return acts + [self.finish()]
