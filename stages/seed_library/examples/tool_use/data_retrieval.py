# spade: domain=tool_use skill=data-retrieval
class ParkingPermitEnv(ToolUseBaseEnv):
    max_turns = 12

    def setup(self):
        r = self.rng
        ids = iter(r.sample(range(100, 1000), 9))
        staff = {f"S{next(ids)}": [n, c] for n in r.sample("Ana Ben Cai Dev".split(), 3)
                 for c in ["Oslo", "Rome", "Lima"]}  # 3 cities per name
        want = {i: r.choice("ABC") for i in r.sample(sorted(staff), 3)}
        self.state = {"staff": staff, "want": want, "permits": {}}
        self.tools = {
            "search_staff": {"description": "Ids and cities of staff with a name.", "parameters": {
                "type": "object", "properties": {"name": {"type": "string"}}}},
            "issue_permit": {"description": "Issue a parking permit.", "parameters": {
                "type": "object", "properties": {
                    "staff_id": {"type": "string"},
                    "zone": {"type": "string", "enum": ["A", "B", "C"]}}}},
            "count_staff": {"description": "Number of staff.", "parameters": {
                "type": "object", "properties": {}}},
        }
        self.instructions = [f"Give {staff[i][0]} from {staff[i][1]} a zone {want[i]} permit."
                             for i in want]
        self.criteria = [lambda s, i=i: s["permits"].get(i) == want[i] for i in want]

    def tool_search_staff(self, name):
        return str({i: v[1] for i, v in self.state["staff"].items() if v[0] == name})

    def tool_issue_permit(self, staff_id, zone):
        if staff_id not in self.state["staff"]:
            return "Error: unknown id."
        self.state["permits"][staff_id] = zone
        return "Issued."

    def tool_count_staff(self):
        return str(len(self.state["staff"]))

    def solution(self):
        want = self.state["want"]
        return [self.call("issue_permit", staff_id=i, zone=want[i]) for i in want] + [self.finish()]
