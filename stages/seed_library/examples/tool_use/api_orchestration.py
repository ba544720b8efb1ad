# spade: domain=tool_use skill=api-orchestration
class ClaimRoutingEnv(ToolUseBaseEnv):
    max_turns = 12

    def setup(self):
        n = self.rng.sample("Ana Ben Cai Dev Eli Fay Gus Hal Ivy".split(), 9)
        boss = {n[i]: n[(i - 1) // 2] for i in range(1, 9)}  # n[0] is the CEO
        asks = [(x, self.rng.choice(["routine", "urgent"])) for x in n[6:]]
        self.state = {"boss": boss, "asks": asks, "sent": {}}
        self.tools = {
            "get_manager": {"description": "Manager of an employee.", "parameters": {
                "type": "object", "properties": {"employee": {"type": "string"}}}},
            "send_claim": {"description": "Send a claim to an approver.", "parameters": {
                "type": "object", "properties": {
                    "employee": {"type": "string"}, "approver": {"type": "string"},
                    "priority": {"type": "string", "enum": ["routine", "urgent"]}}}},
            "holidays": {"description": "Company holidays.", "parameters": {
                "type": "object", "properties": {}}},
        }
        self.instructions = [f"Send {x}'s {p} claim to {x}'s manager's manager." for x, p in asks]
        self.criteria = [lambda s, x=x, v=[boss[boss[x]], p]: s["sent"].get(x) == v
                         for x, p in asks]

    def tool_get_manager(self, employee):
        return self.state["boss"].get(employee, "Error: no manager on file.")

    def tool_send_claim(self, employee, approver, priority):
        if approver not in self.state["boss"].values():
            return f"Error: {approver} is not a manager."
        self.state["sent"][employee] = [approver, priority]
        return "Sent."

    def tool_holidays(self):
        return "Jan 1, Dec 25"

    def solution(self):
        b = self.state["boss"]
        acts = [self.call("send_claim", employee=x, approver=b[b[x]], priority=p)
                for x, p in self.state["asks"]]
        return acts + [self.finish()]
